// The C++ side of the export_hf test (export_hf.sh):
//   drafter_forward_dump make-runs DIR
//     DIR/run:       a training run's folder as the trainer leaves it: complete checkpoints step 2 and 5, an
//                    interrupted save of step 9 (no DONE) and ckpt/best (step 3); each step a different random
//                    drafter, recorded target facts (state.json extra.export)
//     DIR/legacy:    one complete checkpoint (step 1) that records no target facts (an older trainer's)
//     DIR/no_ckpt:   a run folder whose only save was interrupted (step 4, no DONE)
//   drafter_forward_dump dump SOURCE OUT.safetensors
//     reads SOURCE as dflash_eval --drafter does (load_drafter_source: an exported folder, a step folder or a run
//     folder), runs drafter_forward on two fixed sequences in float and in double, and writes the inputs, the
//     final hidden states and the logits through a random stand-in for the target's lm_head to OUT.safetensors
//     (F32 / F64 / I64) for test_export_hf.py. The second sequence is shorter: the file pads its context rows to
//     the first one's length with noise, which no block may read.
// The drafter: 3 layers (full, sliding window 6, full), 4 query / 2 kv heads of 16 (NH·D = 64 ≠ H = 32), block 4,
// 3 taps; norm weights away from 1 and rope_theta 1e4, so that every piece of the forward shows in the outputs.
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cpu/gemm.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/state/drafter_source.h"
#include "lib/model/drafter.h"
#include "lib/model/drafter_export.h"
#include "lib/state/checkpoint.h"

namespace fs = std::filesystem;
using namespace dflash;

namespace {

model::DrafterConfig test_drafter() {
  model::DrafterConfig c;
  c.hidden = 32;
  c.layers = 3;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.intermediate = 48;
  c.block_size = 4;
  c.n_taps = 3;
  c.vocab = 101;
  c.mask_token_id = 100;
  c.rope_theta = 1e4;
  c.rms_norm_eps = 1e-6;
  c.window = {0, 6, 0};
  return c;
}

const model::DrafterExportInfo kInfo{{1, 4, 6}, 8, 4096};

std::vector<float> normal(size_t n, uint64_t seed, double std) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = float(std * rng.normal());
  return v;
}

// A random drafter that looks trained: linear weights N(0, 0.2²), norm weights 1 + N(0, 0.1²).
model::DrafterParams<float> random_drafter(const model::DrafterConfig& cfg, uint64_t seed) {
  model::DrafterParams<float> w(cfg);
  w.init_random(seed, 0.2);
  const std::vector<float> noise = normal(w.flat.size(), seed + 1000, 0.1);
  for (const auto& p : w.layout)
    if (p.is_norm)
      for (size_t k = 0; k < p.numel; ++k) w.flat[p.offset + k] += noise[p.offset + k];
  return w;
}

void save(const std::string& run, int64_t step, const nlohmann::json& extra, bool complete,
          const std::string& step_dir = "") {
  const model::DrafterConfig cfg = test_drafter();
  state::TrainingState st;
  st.step = step;
  st.layout = {1, 1, 1, 1};
  st.config_hash = "0x0000000000000000";
  st.extra = extra;
  const std::string dir = step_dir.empty()
                              ? state::save_checkpoint(run, cfg, random_drafter(cfg, uint64_t(step)), {}, st)
                              : state::save_checkpoint_in(step_dir, cfg, random_drafter(cfg, uint64_t(step)), {}, st);
  if (!complete) fs::remove(fs::path(dir) / "DONE");  // a save interrupted before its last rename
}

int make_runs(const std::string& dir) {
  const nlohmann::json facts = {{"export", model::export_info_json(kInfo)}};
  const std::string run = dir + "/run";
  save(run, 2, facts, true);
  save(run, 5, facts, true);
  save(run, 9, facts, false);
  nlohmann::json best = facts;
  best["best"] = {{"metric", "eval_tau"}, {"value", 2.5}, {"step", 3}};
  save(run, 3, best, true, run + "/ckpt/best");
  save(dir + "/legacy", 1, nlohmann::json::object(), true);
  save(dir + "/no_ckpt", 4, facts, false);
  std::printf("made %s/run (steps 2, 5, interrupted 9, best = 3), %s/legacy (step 1, no extra.export), "
              "%s/no_ckpt (interrupted 4)\n", dir.c_str(), dir.c_str(), dir.c_str());
  return 0;
}

// A minimal safetensors writer for the dtypes the Python side reads (the library's writer takes float data only).
struct DumpTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

template <typename T>
DumpTensor dump_tensor(const std::string& name, const char* dtype, std::vector<int64_t> shape,
                       const std::vector<T>& v) {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  DFLASH_CHECK(n == v.size(), "{}: {} values for shape of {}", name, v.size(), n);
  return {name, dtype, std::move(shape), std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T))};
}

void write_dump(const std::string& path, const std::vector<DumpTensor>& tensors, const nlohmann::json& meta) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}, {"about", meta.dump()}};
  size_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::ofstream f(path, std::ios::binary);
  const uint64_t len = h.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(h.data(), std::streamsize(h.size()));
  for (const auto& t : tensors) f.write(t.bytes.data(), std::streamsize(t.bytes.size()));
  DFLASH_USER_CHECK(f.good(), "cannot write {}", path);
}

struct Sequence {
  int seq_len;
  std::vector<int> anchors;
};

int dump(const std::string& source, const std::string& out_path) {
  state::DrafterSource src = state::load_drafter_source(source);
  const model::DrafterConfig& cfg = src.drafter.config;
  const model::DrafterParams<float>& wf = src.drafter.params;
  model::DrafterParams<double> wd(cfg);
  for (size_t i = 0; i < wf.flat.size(); ++i) wd.flat[i] = double(wf.flat[i]);
  const int H = cfg.hidden, B = cfg.block_size, V = cfg.vocab, W = cfg.n_taps * H;

  // anchor 0 (no context), overlapping blocks, blocks running past S, unsorted anchors, an anchor at S - 1
  const std::vector<Sequence> seqs = {{23, {0, 3, 4, 11, 20, 22}}, {17, {16, 1, 2, 8, 0, 9}}};
  const int S = 23, N = 6, NB = N * B, batch = int(seqs.size());
  const std::vector<float> taps = normal(size_t(batch) * S * W, 11, 1.0);  // rows past a sequence's end: noise
  const std::vector<float> embed = normal(size_t(V) * H, 12, 1.0);          // stand-ins for the target's
  const std::vector<float> lm_head = normal(size_t(V) * H, 13, 0.2);
  const std::vector<double> embed_d(embed.begin(), embed.end()), lm_head_d(lm_head.begin(), lm_head.end());
  Rng rng(14);
  std::vector<int64_t> tokens(size_t(batch) * S, 0), anchors, seq_lens, block_ids;
  std::vector<float> out_f, logits_f;
  std::vector<double> out_d, logits_d;
  for (int b = 0; b < batch; ++b) {
    const Sequence& q = seqs[size_t(b)];
    std::vector<int32_t> tok(static_cast<size_t>(q.seq_len));
    for (int i = 0; i < q.seq_len; ++i) tokens[size_t(b) * S + i] = tok[size_t(i)] = int32_t(rng.below(uint64_t(V - 1)));
    const float* tf = taps.data() + size_t(b) * S * W;
    const std::vector<double> td(tf, tf + size_t(q.seq_len) * W);

    model::DrafterInputs<float> in_f{tf, tok.data(), q.seq_len, q.anchors.data(), N, embed.data()};
    model::DrafterActivations<float> acts_f;
    model::drafter_forward(cfg, wf, in_f, acts_f);
    model::DrafterInputs<double> in_d{td.data(), tok.data(), q.seq_len, q.anchors.data(), N, embed_d.data()};
    model::DrafterActivations<double> acts_d;
    model::drafter_forward(cfg, wd, in_d, acts_d);

    // logits as dflash_eval's DrafterProposer forms them: out · lm_headᵀ
    std::vector<float> lf(size_t(NB) * V);
    std::vector<double> ld(size_t(NB) * V);
    cpu::linear_forward<float>(lf.data(), acts_f.out, lm_head.data(), NB, H, V);
    cpu::linear_forward<double>(ld.data(), acts_d.out, lm_head_d.data(), NB, H, V);
    out_f.insert(out_f.end(), acts_f.out, acts_f.out + size_t(NB) * H);
    out_d.insert(out_d.end(), acts_d.out, acts_d.out + size_t(NB) * H);
    logits_f.insert(logits_f.end(), lf.begin(), lf.end());
    logits_d.insert(logits_d.end(), ld.begin(), ld.end());
    for (int a : q.anchors) anchors.push_back(a);
    for (int32_t t : acts_f.blk_tokens) block_ids.push_back(t);
    seq_lens.push_back(q.seq_len);
  }
  const int64_t b64 = batch, S64 = S, N64 = N, NB64 = NB, H64 = H, V64 = V, W64 = W;
  write_dump(out_path,
             {dump_tensor("taps", "F32", {b64, S64, W64}, taps),
              dump_tensor("seq_len", "I64", {b64}, seq_lens),
              dump_tensor("tokens", "I64", {b64, S64}, tokens),
              dump_tensor("anchors", "I64", {b64, N64}, anchors),
              dump_tensor("block_ids", "I64", {b64, NB64}, block_ids),
              dump_tensor("embed", "F32", {V64, H64}, embed),
              dump_tensor("lm_head", "F32", {V64, H64}, lm_head),
              dump_tensor("out_f32", "F32", {b64, NB64, H64}, out_f),
              dump_tensor("out_f64", "F64", {b64, NB64, H64}, out_d),
              dump_tensor("logits_f32", "F32", {b64, NB64, V64}, logits_f),
              dump_tensor("logits_f64", "F64", {b64, NB64, V64}, logits_d)},
             {{"source", source}, {"kind", src.kind}, {"dir", src.dir}, {"step", src.step}});
  std::printf("dumped the forward of %s (%s %s) on %d sequences x %d anchors to %s\n", source.c_str(),
              src.kind.c_str(), src.dir.c_str(), batch, N, out_path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc >= 2 ? argv[1] : "";
    if (cmd == "make-runs" && argc == 3) return make_runs(argv[2]);
    if (cmd == "dump" && argc == 4) return dump(argv[2], argv[3]);
    std::fprintf(stderr, "usage: drafter_forward_dump make-runs DIR | dump SOURCE OUT.safetensors\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "drafter_forward_dump: error: %s\n", e.what());
    return 1;
  }
}
