#include "lib/state/step_dump.h"

#include <filesystem>

#include <cstdio>

#include "lib/comm/tags.h"
#include "lib/core/atomic_file.h"
#include "lib/core/error.h"
#include "lib/io/safetensors.h"

namespace dflash::state {

namespace {

void send_inputs(comm::Transport& dp, const train::MicroBatchInputs& in) {
  const int64_t header[3] = {in.seq_index, int64_t(in.tokens.size()), int64_t(in.anchors.size())};
  dp.send(header, 3, 0, comm::kTagDumpHeader);
  dp.send(in.tokens.data(), in.tokens.size(), 0, comm::kTagDumpTokens);
  dp.send(in.loss_mask.data(), in.loss_mask.size(), 0, comm::kTagDumpMask);
  dp.send(in.anchors.data(), in.anchors.size(), 0, comm::kTagDumpAnchors);
  dp.send(in.taps.data(), in.taps.size(), 0, comm::kTagDumpTaps);
  dp.send(in.final_hidden.data(), in.final_hidden.size(), 0, comm::kTagDumpFinal);
}

train::MicroBatchInputs recv_inputs(comm::Transport& dp, int src, int tap_width, int hidden) {
  int64_t header[3];
  dp.recv(header, 3, src, comm::kTagDumpHeader);
  train::MicroBatchInputs in;
  in.seq_index = header[0];
  const size_t S = size_t(header[1]), N = size_t(header[2]);
  in.tokens.resize(S);
  in.loss_mask.resize(S);
  in.anchors.resize(N);
  in.taps.resize(S * tap_width);
  in.final_hidden.resize(S * hidden);
  dp.recv(in.tokens.data(), S, src, comm::kTagDumpTokens);
  dp.recv(in.loss_mask.data(), S, src, comm::kTagDumpMask);
  dp.recv(in.anchors.data(), N, src, comm::kTagDumpAnchors);
  dp.recv(in.taps.data(), in.taps.size(), src, comm::kTagDumpTaps);
  dp.recv(in.final_hidden.data(), in.final_hidden.size(), src, comm::kTagDumpFinal);
  return in;
}

template <typename T>
std::vector<float> as_f32(const std::vector<T>& v) {
  return std::vector<float>(v.begin(), v.end());
}

}  // namespace

std::string write_step_dump(const std::string& dir, comm::Transport& dp, const train::RunPlan& plan,
                            const TrainConfig& cfg, const train::StepResult& r, const train::StepCapture& capture,
                            const model::DrafterParams<float>& layout_of, const std::vector<float>& start_weights) {
  if (dp.rank() != 0) {
    for (const auto& in : capture.inputs) send_inputs(dp, in);
    return "";
  }
  const int H = plan.target.hidden, tap_width = int(plan.tap_ids.size()) * H, M = cfg.optim.micro_batches;
  const int dp_size = dp.size();
  std::vector<train::MicroBatchInputs> slots(size_t(M) * dp_size);
  for (int m = 0; m < M; ++m) slots[size_t(m) * dp_size] = capture.inputs.at(m);
  for (int src = 1; src < dp_size; ++src)
    for (int m = 0; m < M; ++m) slots[size_t(m) * dp_size + src] = recv_inputs(dp, src, tap_width, H);

  // keep every buffer alive until write_safetensors has run the fills
  std::vector<std::vector<float>> keep;
  std::vector<io::TensorToWrite> tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float> data) {
    keep.push_back(std::move(data));
    tensors.push_back(io::tensor_from(name, io::DType::F32, std::move(shape), keep.back().data()));
  };
  keep.reserve(slots.size() * 5 + 5);
  for (size_t k = 0; k < slots.size(); ++k) {
    const train::MicroBatchInputs& in = slots[k];
    const std::string p = fmt::format("inputs.slot{}.", k);
    const int64_t S = int64_t(in.tokens.size());
    add(p + "tokens", {S}, as_f32(in.tokens));
    add(p + "loss_mask", {S}, as_f32(in.loss_mask));
    add(p + "anchors", {int64_t(in.anchors.size())}, as_f32(in.anchors));
    add(p + "taps", {S, tap_width}, in.taps);
    add(p + "final_hidden", {S, H}, in.final_hidden);
  }
  const double w = r.sums.weight > 0 ? r.sums.weight : 1.0;
  add("loss", {1}, {float(r.sums.loss / w)});
  add("loss.ce", {1}, {float(r.sums.ce / w)});
  add("loss.kl", {1}, {float(r.sums.kl / w)});
  add("loss.cap", {1}, {float(r.sums.cap / w)});
  add("loss.weight_sum", {1}, {float(r.sums.weight)});
  DFLASH_CHECK(start_weights.size() == layout_of.flat.size(), "step dump: {} starting weights for {} parameters",
               start_weights.size(), layout_of.flat.size());
  for (const model::ParamInfo& p : layout_of.layout) {
    tensors.push_back(io::tensor_from(p.name, io::DType::F32, p.shape, capture.grads.data() + p.offset));
    tensors.push_back(io::tensor_from("weights." + p.name, io::DType::F32, p.shape, start_weights.data() + p.offset));
  }
  std::vector<std::string> layer_types;
  for (int w : plan.drafter.window) layer_types.push_back(w > 0 ? fmt::format("sliding:{}", w) : "full");

  std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"dflash.step", std::to_string(r.step + 1)},
      {"dflash.config_hash", config_hash_hex(cfg)},
      {"dflash.loss", fmt::format("{:.17g}", r.sums.loss / w)},
      {"dflash.loss.ce", fmt::format("{:.17g}", r.sums.ce / w)},
      {"dflash.loss.kl", fmt::format("{:.17g}", r.sums.kl / w)},
      {"dflash.loss.cap", fmt::format("{:.17g}", r.sums.cap / w)},
      {"dflash.loss.weight_sum", fmt::format("{:.17g}", r.sums.weight)},
      {"dflash.target_layer_ids", fmt::format("{}", fmt::join(plan.tap_ids, ","))},
      {"dflash.loss.ce_weight", fmt::format("{:.17g}", cfg.loss.ce_weight)},
      {"dflash.loss.kl_weight", fmt::format("{:.17g}", cfg.loss.kl_weight)},
      {"dflash.loss.cap_weight", fmt::format("{:.17g}", cfg.loss.cap_weight)},
      {"dflash.loss.kl_temperature", fmt::format("{:.17g}", cfg.loss.kl_temperature)},
      {"dflash.loss.decay_gamma", fmt::format("{:.17g}", plan.decay_gamma)},
      {"dflash.block_size", std::to_string(plan.drafter.block_size)},
      {"dflash.mask_token_id", std::to_string(plan.drafter.mask_token_id)},
      {"dflash.anchors_per_seq", std::to_string(cfg.loss.anchors_per_seq)},
      {"dflash.seed", std::to_string(cfg.run.seed)},
      {"dflash.layer_types", fmt::format("{}", fmt::join(layer_types, ","))},
      {"dflash.weights", "weights.<name>: the weights the step started from; <name>: gradient (normalised by the "
                         "global sum of weights, before clipping)"},
      {"dflash.slots", "slot k = micro_batch * drafter_dp + drafter_rank; ids and masks stored as F32"},
  };
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DFLASH_USER_CHECK(!ec, "--dump-step {}: cannot create the folder: {}", dir, ec.message());
  AtomicOutput out(fmt::format("{}/step_{:08d}.safetensors", dir, r.step + 1));
  io::write_safetensors(out.partial(), tensors, meta);
  out.commit();
  return out.path();
}

void StepDumper::before(int64_t) {
  if (!active()) return;
  capture_ = train::StepCapture{};
  start_weights_ = drafter_.params().flat;
}

std::string StepDumper::after(const train::StepResult& r) {
  if (!active()) return "";
  return write_step_dump(dir_, dp_, plan_, cfg_, r, capture_, drafter_.params(), start_weights_);
}

}  // namespace dflash::state
