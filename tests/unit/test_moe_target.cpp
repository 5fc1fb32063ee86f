// Qwen3-MoE targets: config.json parsing and its refusals, the expert split over TP ranks, the router's top-k with
// its tie rule against a brute-force reference, and the TP forward against the fixtures transformers made
// (tests/golden_moe/make_golden.py) at TP 1, 2, 3 and 5 — the ranks as threads of this process over an in-process
// transport (the mpirun runs of the same fixtures are moe_golden_*_np{1,2,3,5}).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/comm/shard.h"
#include "lib/comm/transport.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/io/safetensors.h"
#include "lib/model/qwen_config.h"
#include "lib/model/random_target.h"
#include "lib/model/target.h"
#include "lib/model/target_layers.h"
#include "lib/model/target_shard.h"
#include "tests/unit/test_util.h"

using namespace dflash;
using namespace dflash::model;

#ifndef DFLASH_GOLDEN_MOE_DIR
#error "DFLASH_GOLDEN_MOE_DIR must name tests/golden_moe"
#endif

namespace {

const std::string kGolden = DFLASH_GOLDEN_MOE_DIR;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

// Qwen3-30B-A3B's config.json (the keys that matter; transformers 4.51 era, as published)
nlohmann::json qwen3_30b_a3b() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
    "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32,
    "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

std::string error_of(const nlohmann::json& j) {
  try {
    parse_qwen_config(j, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// transformers' rule (Qwen3MoeDecoderLayer): experts unless in mlp_only_layers, and (l + 1) % step == 0
std::vector<bool> hf_moe_layers(const nlohmann::json& j) {
  const int L = j["num_hidden_layers"];
  const int step = j.value("decoder_sparse_step", 1);
  std::vector<int> dense = j.value("mlp_only_layers", std::vector<int>{});
  std::vector<bool> m;
  for (int l = 0; l < L; ++l) m.push_back(std::find(dense.begin(), dense.end(), l) == dense.end() && (l + 1) % step == 0);
  return m;
}

// A TP group of threads in one process: collectives through shared slots, in rank order (so every rank gets the
// same bits). A rank that throws fails the group, and the others' waits throw instead of hanging.
struct ThreadGroup {
  explicit ThreadGroup(int n) : size(n), slots(static_cast<size_t>(n)) {}
  int size;
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0;
  long generation = 0;
  bool failed = false;
  std::vector<std::vector<double>> slots;
  std::vector<char> bytes;

  void wait() {
    std::unique_lock<std::mutex> lock(m);
    DFLASH_CHECK(!failed, "thread group: another rank failed");
    const long g = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != g || failed; });
    }
    DFLASH_CHECK(!failed, "thread group: another rank failed");
  }
  void fail() {
    std::lock_guard<std::mutex> lock(m);
    failed = true;
    cv.notify_all();
  }
};

class ThreadTransport final : public comm::Transport {
 public:
  ThreadTransport(ThreadGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size; }
  void allreduce_sum(float* data, size_t n) override { sum(data, n); }
  void allreduce_sum(double* data, size_t n) override { sum(data, n); }
  void broadcast_bytes(void* data, size_t bytes, int root) override {
    if (rank_ == root) g_.bytes.assign(static_cast<char*>(data), static_cast<char*>(data) + bytes);
    g_.wait();
    if (rank_ != root) std::memcpy(data, g_.bytes.data(), bytes);
    g_.wait();
  }
  void send_bytes(const void*, size_t, int, int) override { DFLASH_FAIL("thread transport: no point-to-point"); }
  void recv_bytes(void*, size_t, int, int) override { DFLASH_FAIL("thread transport: no point-to-point"); }
  comm::Request isend_bytes(const void*, size_t, int, int) override {
    DFLASH_FAIL("thread transport: no point-to-point");
  }
  comm::Request irecv_bytes(void*, size_t, int, int) override { DFLASH_FAIL("thread transport: no point-to-point"); }
  void barrier() override { g_.wait(); }
  bool probe(int, int) override { return false; }

 private:
  template <typename U>
  void sum(U* data, size_t n) {
    g_.slots[size_t(rank_)].assign(data, data + n);
    g_.wait();
    for (size_t i = 0; i < n; ++i) {
      U acc = 0;
      for (int r = 0; r < g_.size; ++r) acc += U(g_.slots[size_t(r)][i]);
      data[i] = acc;
    }
    g_.wait();  // every rank has read the slots before any rank writes its next partial sum
  }
  ThreadGroup& g_;
  int rank_;
};

// Runs body(transport, rank) on `tp` threads; rethrows the first failure's message as a test failure.
template <typename F>
void run_tp(int tp, F body) {
  ThreadGroup group(tp);
  std::vector<std::string> errors(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      try {
        ThreadTransport t(group, r);
        body(t, r);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        group.fail();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < tp; ++r) {
    INFO("rank " << r << " of " << tp);
    CHECK(errors[size_t(r)] == "");
  }
}

struct Diff {
  double abs = 0, rel = 0;
};
Diff diff(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
    den = std::max(den, std::fabs(double(b[i])));
  }
  REQUIRE(den > 0);
  return {num, num / den};
}

}  // namespace

TEST_CASE("qwen_config: parses Qwen3-30B-A3B (Qwen3MoeForCausalLM)") {
  const nlohmann::json j = qwen3_30b_a3b();
  const QwenConfig c = parse_qwen_config(j, "cfg.json");
  CHECK_FALSE(c.hybrid);
  CHECK(c.experts == j["num_experts"].get<int>());
  CHECK(c.experts_per_token == j["num_experts_per_tok"].get<int>());
  CHECK(c.moe_intermediate == j["moe_intermediate_size"].get<int>());
  CHECK(c.norm_topk_prob == j["norm_topk_prob"].get<bool>());
  CHECK(c.intermediate == j["intermediate_size"].get<int>());
  CHECK(c.moe_layers == hf_moe_layers(j));
  CHECK_FALSE(c.any_dense_mlp());
  // what we write parses back to the same MoE shape
  const QwenConfig d = parse_qwen_config(qwen_config_json(c), "written");
  CHECK(d.experts == c.experts);
  CHECK(d.experts_per_token == c.experts_per_token);
  CHECK(d.moe_intermediate == c.moe_intermediate);
  CHECK(d.norm_topk_prob == c.norm_topk_prob);
  CHECK(d.moe_layers == c.moe_layers);
}

TEST_CASE("qwen_config: Qwen3-MoE layer selection, transformers 5 key names and defaults") {
  auto j = qwen3_30b_a3b();
  j["num_hidden_layers"] = 7;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3, 0};
  CHECK(parse_qwen_config(j, "cfg.json").moe_layers == hf_moe_layers(j));
  CHECK(parse_qwen_config(j, "cfg.json").any_dense_mlp());
  // the fixtures' config.json as transformers 5 writes it: num_local_experts, rope_parameters
  for (const char* name : {"per_expert", "fused"}) {
    const nlohmann::json f = read_json(kGolden + "/" + name + "/config.json");
    const QwenConfig c = parse_qwen_config(f, name);
    CHECK(c.experts == f["num_local_experts"].get<int>());
    CHECK(c.moe_layers == hf_moe_layers(f));
  }
  // norm_topk_prob defaults to false and the layer rule to every layer, as in Qwen3MoeConfig
  j = qwen3_30b_a3b();
  j.erase("norm_topk_prob");
  j.erase("decoder_sparse_step");
  j.erase("mlp_only_layers");
  const QwenConfig c = parse_qwen_config(j, "cfg.json");
  CHECK_FALSE(c.norm_topk_prob);
  CHECK(c.moe_layers == std::vector<bool>(size_t(c.layers), true));
}

TEST_CASE("qwen_config: Qwen3-MoE refusals name the key") {
  auto j = qwen3_30b_a3b();
  j.erase("num_experts_per_tok");
  CHECK(error_of(j).find("num_experts_per_tok") != std::string::npos);
  j = qwen3_30b_a3b();
  j["num_experts_per_tok"] = j["num_experts"].get<int>() + 1;
  CHECK(error_of(j).find("exceeds num_experts") != std::string::npos);
  j = qwen3_30b_a3b();
  j["mlp_only_layers"] = {j["num_hidden_layers"].get<int>()};
  CHECK(error_of(j).find("mlp_only_layers") != std::string::npos);
  j = qwen3_30b_a3b();
  j["shared_expert_intermediate_size"] = 512;
  CHECK(error_of(j).find("shared_expert_intermediate_size") != std::string::npos);
  j = qwen3_30b_a3b();
  j["num_local_experts"] = j["num_experts"].get<int>() / 2;
  CHECK(error_of(j).find("disagree") != std::string::npos);
  j = qwen3_30b_a3b();
  j["mlp_only_layers"] = {0};
  j.erase("intermediate_size");
  CHECK(error_of(j).find("intermediate_size") != std::string::npos);
  j = qwen3_30b_a3b();
  j["use_sliding_window"] = true;
  CHECK(error_of(j).find("use_sliding_window") != std::string::npos);
  j = qwen3_30b_a3b();
  j["architectures"] = {"Qwen3_5MoeForConditionalGeneration"};
  CHECK(error_of(j).find("Qwen3_5MoeForConditionalGeneration") != std::string::npos);
}

TEST_CASE("qwen_config: the Qwen3.5/3.6 MoE hybrid (Qwen3_5MoeForConditionalGeneration)") {
  const nlohmann::json j = read_json(kGolden + "/qwen3_5_moe/config.json");
  const nlohmann::json& t = j["text_config"];
  const QwenConfig c = parse_qwen_config(j, "qwen3_5_moe");
  CHECK(c.hybrid);
  CHECK(c.weight_prefix == "model.language_model.");
  CHECK(c.experts == t["num_experts"].get<int>());
  CHECK(c.experts_per_token == t["num_experts_per_tok"].get<int>());
  CHECK(c.moe_intermediate == t["moe_intermediate_size"].get<int>());
  CHECK(c.shared_expert_intermediate == t["shared_expert_intermediate_size"].get<int>());
  CHECK(c.norm_topk_prob);  // Qwen3_5MoeTopKRouter always renormalises
  CHECK(c.moe_layers == std::vector<bool>(size_t(c.layers), true));
  int linear = 0;
  for (int l = 0; l < c.layers; ++l) linear += c.is_linear(l) == (t["layer_types"][size_t(l)] == "linear_attention");
  CHECK(linear == c.layers);
  // what we write (the causal-LM layout) parses back to the same shape
  const QwenConfig d = parse_qwen_config(qwen_config_json(c), "written");
  CHECK(d.architecture == "Qwen3_5MoeForCausalLM");
  CHECK(d.shared_expert_intermediate == c.shared_expert_intermediate);
  CHECK(d.experts == c.experts);
  CHECK(d.linear_v_heads == c.linear_v_heads);
  // refused: what the Qwen3.5 MoE layer does not do
  auto k = j;
  k["text_config"]["norm_topk_prob"] = false;
  CHECK(error_of(k).find("norm_topk_prob") != std::string::npos);
  k = j;
  k["text_config"]["mlp_only_layers"] = {0};
  CHECK(error_of(k).find("mlp_only_layers") != std::string::npos);
  k = j;
  k["text_config"].erase("shared_expert_intermediate_size");
  CHECK(error_of(k).find("shared_expert_intermediate_size") != std::string::npos);
  k = j;
  k["architectures"] = {"Qwen3_5ForConditionalGeneration"};  // a dense hybrid with experts in its config
  k["text_config"]["intermediate_size"] = 64;
  CHECK(error_of(k).find("num_experts") != std::string::npos);
}

TEST_CASE("moe target: make-target qwen3_5_moe loads and matches the fp64 target at TP 1 and 3") {
  RandomTargetSpec spec = test::small_random_target(true, 4, 9);
  spec.heads = 6;
  spec.linear_v_heads = 6;
  spec.linear_k_heads = 2;
  spec.experts = 5;
  spec.moe_intermediate = 12;
  spec.shared_expert_intermediate = 20;
  const std::string dir = test::scratch_dir("moe35").string();
  write_random_target(dir, spec);
  const QwenConfig c = load_qwen_config(dir);
  REQUIRE(c.shared_expert_intermediate == spec.shared_expert_intermediate);
  const int S = 40, H = c.hidden;
  std::vector<int32_t> tokens(static_cast<size_t>(S));
  for (int i = 0; i < S; ++i) tokens[size_t(i)] = (i * 29 + 3) % c.vocab;
  std::vector<float> f64(size_t(S) * H);
  comm::SelfTransport self;
  TargetOptions o64;
  o64.precision = kernels::Precision::fp64;
  TargetModel t64(dir, self, o64);
  t64.forward(tokens.data(), S, {}, nullptr, f64.data());
  for (const int tp : {1, 3}) {
    std::vector<std::vector<float>> finals(static_cast<size_t>(tp));
    run_tp(tp, [&](comm::Transport& t, int r) {
      TargetOptions opt;
      opt.mlp_grain = 4;
      TargetModel target(dir, t, opt);
      finals[size_t(r)].resize(size_t(S) * H);
      target.forward(tokens.data(), S, {}, nullptr, finals[size_t(r)].data());
    });
    INFO("TP " << tp);
    CHECK(diff(finals[0].data(), f64.data(), f64.size()).rel <= 1e-5);
  }
}

// The target's activation arena is sized by the same bind lists its forward allocates from (lib/core/arena_plan.h):
// on a fresh model the first forward's peak is exactly the size it planned, for every token mixer (attention, Gated
// DeltaNet, routed experts with and without a shared expert) on every rank of TP 1 and 3 (uneven shards, a rank
// with no shared-expert channels). An allocation outside the lists overruns the arena (an error) or shows here.
TEST_CASE("target arena: the first forward uses exactly the bytes its bind lists plan (dense, hybrid, MoE, at TP 1 and 3)") {
  struct Kind {
    const char* name;
    bool hybrid;
    int experts;
  };
  for (const Kind& kind :
       {Kind{"dense", false, 0}, Kind{"hybrid", true, 0}, Kind{"moe", false, 5}, Kind{"moe_hybrid", true, 5}}) {
    CAPTURE(kind.name);
    RandomTargetSpec spec = test::small_random_target(kind.hybrid, 3, 5);
    spec.full_attention_interval = 2;
    spec.experts = kind.experts;
    spec.moe_intermediate = 12;
    spec.shared_expert_intermediate = 20;
    const std::string dir = test::scratch_dir(std::string("arena_") + kind.name).string();
    write_random_target(dir, spec);
    std::vector<int32_t> tokens(37);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 17 + 5) % size_t(spec.vocab));
    for (const int tp : {1, 3}) {
      CAPTURE(tp);
      std::vector<model::TargetStats> first(static_cast<size_t>(tp)), second(static_cast<size_t>(tp));
      run_tp(tp, [&](comm::Transport& t, int r) {
        TargetModel target(dir, t, TargetOptions{});
        std::vector<float> final_hidden(tokens.size() * size_t(spec.hidden));
        target.forward(tokens.data(), int(tokens.size()), {}, nullptr, final_hidden.data());
        first[size_t(r)] = target.stats();
        target.forward(tokens.data(), 11, {}, nullptr, final_hidden.data());  // shorter: fits the arena made
        second[size_t(r)] = target.stats();
      });
      for (int r = 0; r < tp; ++r) {
        CAPTURE(r);
        CHECK(first[size_t(r)].activation_bytes > 0);
        CHECK(first[size_t(r)].activation_peak_bytes == first[size_t(r)].activation_bytes);
        CHECK(second[size_t(r)].activation_bytes < first[size_t(r)].activation_bytes);
        CHECK(second[size_t(r)].activation_peak_bytes == first[size_t(r)].activation_peak_bytes);
      }
    }
  }
}

TEST_CASE("moe shard: every expert on exactly one rank, contiguous, counts within one") {
  auto j = qwen3_30b_a3b();
  for (int E : {1, 2, 4, 5, 6, 7, 12, 128}) {
    j["num_experts"] = E;
    j["num_experts_per_tok"] = 1;
    const QwenConfig c = parse_qwen_config(j, "cfg.json");
    for (int tp = 1; tp <= 8; ++tp) {
      std::vector<int> owner(static_cast<size_t>(E), -1);
      int next = 0, lo = E, hi = 0;
      for (int r = 0; r < tp; ++r) {
        const TargetShard s = plan_target_shard(c, tp, r, 64);
        CHECK(s.expert_begin == next);  // contiguous, in rank order
        for (int e = s.expert_begin; e < s.expert_begin + s.expert_count; ++e) {
          CHECK(owner[size_t(e)] == -1);
          owner[size_t(e)] = r;
        }
        next = s.expert_begin + s.expert_count;
        lo = std::min(lo, s.expert_count);
        hi = std::max(hi, s.expert_count);
      }
      CHECK(next == E);
      CHECK(std::count(owner.begin(), owner.end(), -1) == 0);
      CHECK(hi - lo <= 1);
    }
  }
}

TEST_CASE("moe routing: top-k with the tie rule (lower expert index wins) and the weights, against a reference") {
  for (int E : {1, 3, 6, 7, 16}) {
    for (int k = 1; k <= std::min(E, 4); ++k) {
      for (bool norm : {false, true}) {
        const int S = 40;
        // logits on a coarse grid: many exact ties between experts
        std::vector<float> z = test::random_floats(size_t(S) * E, uint64_t(100 * E + 10 * k + norm));
        for (float& v : z) v = std::round(v * 2.f) / 2.f;
        const MoeRouting r = route_tokens(z.data(), S, E, k, norm);
        std::vector<std::vector<int>> served(static_cast<size_t>(E));
        for (int t = 0; t < S; ++t) {
          const float* zt = &z[size_t(t) * E];
          // reference: k times, the largest remaining logit, the first (lowest index) of equal ones
          std::vector<bool> taken(static_cast<size_t>(E), false);
          long double sum = 0, chosen = 0;
          for (int e = 0; e < E; ++e) sum += std::exp((long double)zt[e]);
          std::vector<int> want;
          for (int j = 0; j < k; ++j) {
            int best = -1;
            for (int e = 0; e < E; ++e)
              if (!taken[size_t(e)] && (best < 0 || zt[e] > zt[best])) best = e;
            taken[size_t(best)] = true;
            want.push_back(best);
            chosen += std::exp((long double)zt[best]) / sum;
          }
          for (int j = 0; j < k; ++j) {
            const int e = want[size_t(j)];
            CHECK(r.chosen[size_t(t) * k + j] == e);
            long double w = std::exp((long double)zt[e]) / sum;
            if (norm) w /= chosen;
            CHECK(std::fabs(double(r.weight[size_t(t) * k + j] - w)) <= 1e-14);
            served[size_t(e)].push_back(t);
          }
        }
        // per expert: its tokens ascending, with the weights of the choice
        CHECK(r.expert_start.back() == int64_t(S) * k);
        for (int e = 0; e < E; ++e) {
          REQUIRE(r.count(e) == int(served[size_t(e)].size()));
          for (int i = 0; i < r.count(e); ++i) {
            const size_t at = size_t(r.expert_start[size_t(e)] + i);
            CHECK(r.tokens[at] == served[size_t(e)][size_t(i)]);
            const int t = r.tokens[at];
            const auto* c = &r.chosen[size_t(t) * k];
            const int j = int(std::find(c, c + k, e) - c);
            CHECK(r.token_weight[at] == r.weight[size_t(t) * k + j]);
          }
        }
      }
    }
  }
}

TEST_CASE("moe target: transformers' Qwen3-MoE and Qwen3.5-MoE fixtures at TP 1, 2, 3, 5 (ranks as threads)") {
  for (const char* name : {"per_expert", "fused", "qwen3_5_moe"}) {
    const std::string dir = kGolden + "/" + name;
    io::SafetensorsFile golden(dir + "/golden.safetensors");
    const QwenConfig c = load_qwen_config(dir);
    const int H = c.hidden, L = c.layers;
    int moe_layers = 0;
    for (int l = 0; l < L; ++l) moe_layers += c.is_moe(l);
    std::vector<int> all_layers;
    for (int l = 0; l < L; ++l) all_layers.push_back(l);
    for (const int S : {30, 70}) {
      const std::string sfx = ".s" + std::to_string(S);
      const std::vector<float> tok_f = golden.read("tokens" + sfx), hf_layers = golden.read("layers" + sfx),
                               hf_final = golden.read("final" + sfx);
      REQUIRE(hf_layers.size() == size_t(L) * S * H);
      const std::vector<int32_t> tokens(tok_f.begin(), tok_f.end());
      for (const int tp : {1, 2, 3, 5}) {
        std::vector<std::vector<float>> taps(static_cast<size_t>(tp)), finals(static_cast<size_t>(tp));
        std::vector<int64_t> rows(static_cast<size_t>(tp));
        std::vector<int> held(static_cast<size_t>(tp));
        run_tp(tp, [&](comm::Transport& t, int r) {
          TargetOptions opt;
          opt.attention_block = 16;
          opt.mlp_grain = 8;
          TargetModel target(dir, t, opt);
          taps[size_t(r)].resize(size_t(S) * L * H);
          finals[size_t(r)].resize(size_t(S) * H);
          target.forward(tokens.data(), S, all_layers, taps[size_t(r)].data(), finals[size_t(r)].data());
          rows[size_t(r)] = target.stats().expert_rows;
          held[size_t(r)] = target.shard().expert_count;
        });
        Diff worst;
        for (int l = 0; l < L; ++l) {
          std::vector<float> ours(size_t(S) * H);
          for (int i = 0; i < S; ++i) std::copy_n(&taps[0][(size_t(i) * L + l) * H], H, &ours[size_t(i) * H]);
          const Diff d = diff(ours.data(), &hf_layers[size_t(l) * S * H], ours.size());
          worst.abs = std::max(worst.abs, d.abs);
          worst.rel = std::max(worst.rel, d.rel);
        }
        const Diff df = diff(finals[0].data(), hf_final.data(), finals[0].size());
        MESSAGE(std::string(name) << " S " << S << " TP " << tp << ": layers max abs " << worst.abs << " (rel " << worst.rel
                     << "), final max abs " << df.abs << " (rel " << df.rel << ")");
        CHECK(worst.rel <= 1e-4);
        CHECK(df.rel <= 1e-4);
        // every rank holds the same bits; the ranks' experts together served every (token, choice) once
        int64_t total_rows = 0, total_held = 0;
        for (int r = 0; r < tp; ++r) {
          CHECK(std::memcmp(taps[size_t(r)].data(), taps[0].data(), taps[0].size() * sizeof(float)) == 0);
          CHECK(std::memcmp(finals[size_t(r)].data(), finals[0].data(), finals[0].size() * sizeof(float)) == 0);
          total_rows += rows[size_t(r)];
          total_held += held[size_t(r)];
        }
        CHECK(total_held == c.experts);
        CHECK(total_rows == int64_t(S) * c.experts_per_token * moe_layers);
      }
    }
  }
}

TEST_CASE("moe target: make-target qwen3_moe, per-expert and fused layouts of the same weights agree") {
  // one random MoE written per expert; the same tensors rewritten fused (gate rows then up rows) must load to
  // the same forward, bit for bit, at TP 1 and 3
  RandomTargetSpec spec = test::small_random_target(false, 3, 7);
  spec.heads = 6;
  spec.experts = 5;
  spec.experts_per_token = 2;
  spec.moe_intermediate = 20;
  spec.mlp_only_layers = {1};
  const std::string a = test::scratch_dir("moe_per_expert").string(), b = test::scratch_dir("moe_fused").string();
  write_random_target(a, spec);
  {
    io::Checkpoint ck(a);
    std::vector<io::TensorToWrite> out;
    std::vector<std::vector<float>> keep;
    const int64_t E = spec.experts, I = spec.moe_intermediate, H = spec.hidden;
    for (const std::string& n : ck.names()) {
      if (n.find(".mlp.experts.") != std::string::npos) continue;
      keep.push_back(ck.read(n));
      out.push_back(io::tensor_from(n, io::DType::F32, ck.info(n).shape, keep.back().data()));
    }
    for (int l = 0; l < spec.layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
      if (!ck.has(p + "0.gate_proj.weight")) continue;
      std::vector<float> gu, down;
      for (int64_t e = 0; e < E; ++e) {
        for (const char* w : {"gate_proj", "up_proj"}) {
          const auto v = ck.read(p + std::to_string(e) + "." + w + ".weight");
          gu.insert(gu.end(), v.begin(), v.end());
        }
        const auto d = ck.read(p + std::to_string(e) + ".down_proj.weight");
        down.insert(down.end(), d.begin(), d.end());
      }
      keep.push_back(gu);
      out.push_back(io::tensor_from(p + "gate_up_proj", io::DType::F32, {E, 2 * I, H}, keep.back().data()));
      keep.push_back(down);
      out.push_back(io::tensor_from(p + "down_proj", io::DType::F32, {E, H, I}, keep.back().data()));
    }
    std::filesystem::create_directories(b);
    io::write_safetensors(b + "/model.safetensors", out);
    std::filesystem::copy_file(a + "/config.json", b + "/config.json",
                               std::filesystem::copy_options::overwrite_existing);
  }
  const QwenConfig c = load_qwen_config(a);
  REQUIRE(c.experts == spec.experts);
  CHECK(c.is_moe(0));
  CHECK_FALSE(c.is_moe(1));
  const int S = 25, H = c.hidden;
  std::vector<int32_t> tokens(static_cast<size_t>(S));
  for (int i = 0; i < S; ++i) tokens[size_t(i)] = (i * 37 + 5) % c.vocab;
  for (const int tp : {1, 3}) {
    std::vector<std::vector<float>> out(2);
    for (int which = 0; which < 2; ++which) {
      std::vector<std::vector<float>> finals(static_cast<size_t>(tp));
      run_tp(tp, [&](comm::Transport& t, int r) {
        TargetModel target(which ? b : a, t, TargetOptions{});
        finals[size_t(r)].resize(size_t(S) * H);
        target.forward(tokens.data(), S, {}, nullptr, finals[size_t(r)].data());
      });
      out[size_t(which)] = finals[0];
    }
    INFO("TP " << tp);
    CHECK(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)) == 0);
    // and a double reference of the same model agrees (the fp64 target)
    std::vector<float> f64(size_t(S) * H);
    comm::SelfTransport self;
    TargetOptions o64;
    o64.precision = kernels::Precision::fp64;
    TargetModel t64(a, self, o64);
    t64.forward(tokens.data(), S, {}, nullptr, f64.data());
    CHECK(diff(out[0].data(), f64.data(), f64.size()).rel <= 1e-5);
  }
}
