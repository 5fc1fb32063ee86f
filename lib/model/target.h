#pragma once
// The frozen Qwen target (dense Qwen3, or the Qwen3.5 / Qwen3.6 hybrids of Gated DeltaNet and gated full
// attention layers), tensor-parallel over one TP group, forward only, fp32, on a kernels::Backend<float> (the CPU
// backend unless the caller hands it another: the trainer's target ranks use CUDA with run.device cuda).
//
// Per decoder layer (Megatron naming): column-parallel q/k/v (this rank's heads) and gate/up (its intermediate
// channels), row-parallel o/down (the matching input columns) each followed by one all-reduce of the [S, H]
// partial sums, after which every TP rank holds the full activations. bf16/f16 checkpoints are widened to fp32
// on load. Each rank reads only its own slices from the mmapped checkpoint; embedding rows are read per forward
// for the tokens at hand, so no rank keeps the [V, H] table.
//
// Where things live: the weights in the backend's memory (one Buffer per tensor, uploaded once at load), the
// activations of a forward in one arena of backend memory (grown to the largest forward seen); the embedding rows
// are read on the host and uploaded, taps and final_hidden downloaded to the caller's host arrays, and the
// row-parallel all-reduces run on the host transport (on a device backend: download, all-reduce, upload). The
// TargetCache of an incremental decode lives in the backend's memory too; what the speculative decoders do to it
// (truncate, snapshot / restore of the recurrent part, keep a tree path) are TargetModel methods that run there.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "lib/comm/transport.h"
#include "lib/core/buffer.h"
#include "lib/io/safetensors.h"
#include "lib/model/qwen_config.h"
#include "lib/model/target_shard.h"

namespace dflash::model {

struct TargetOptions {
  int mlp_grain = 64;        // intermediate channels per shard unit (tile alignment)
  int attention_block = 64;  // query rows per attention block (scores held: block × S floats; CPU backend)
  // The backend the forward runs on; null: a CPU backend with attention_block. Weights and activations are
  // allocated in its memory (device memory on the calling thread's current GPU for CUDA).
  std::shared_ptr<kernels::Backend<float>> backend;
};

struct TargetStats {
  long forwards = 0;
  int64_t tokens = 0;
  double forward_seconds = 0;    // wall time inside forward()
  double allreduce_seconds = 0;  // wall time inside the row-parallel all-reduces (waiting included)
  long allreduces = 0;
  // compute inside forward() by layer part (all-reduces excluded): the token mixer of Gated DeltaNet layers, of full
  // attention layers, and the MLP (its norm included)
  double linear_attention_seconds = 0, full_attention_seconds = 0, mlp_seconds = 0;
};

// One weight tensor in the backend's memory (fp32).
struct TargetWeight {
  Buffer buffer;
  size_t count = 0;  // floats
  const float* data() const { return buffer.as<float>(); }
  size_t size() const { return count; }
  bool empty() const { return count == 0; }
};

// One decoder layer's slices on this rank (shapes with the shard's local sizes: qd = q_count·head_dim,
// kvd = kv_count·head_dim, ic = mlp_end − mlp_begin; DeltaNet: nk key heads of dk, nv value heads of dv held).
// Hybrid RMSNorm weights are stored here as 1 + w (Qwen3.5 scales by 1 + w), so one rmsnorm kernel serves both.
struct TargetLayer {
  bool linear = false;            // Gated DeltaNet layer (else full attention)
  TargetWeight input_norm;  // [H]
  TargetWeight wq;          // [qd, H] rows of q_proj; hybrid: [q_count, 2, head_dim] rows = query, gate
  TargetWeight wk, wv;      // [kvd, H]  rows of k_proj, v_proj
  TargetWeight q_norm;      // [head_dim]
  TargetWeight k_norm;      // [head_dim]
  TargetWeight wo;          // [H, qd]   columns of o_proj
  TargetWeight post_norm;   // [H]
  TargetWeight wgate, wup;  // [ic, H]   rows of gate_proj, up_proj
  TargetWeight wdown;       // [H, ic]   columns of down_proj
  // Gated DeltaNet (linear_attn.*)
  TargetWeight w_qkv;             // [2·nk·dk + nv·dv, H] rows of in_proj_qkv: this rank's q | k | v channels
  TargetWeight conv;              // [2·nk·dk + nv·dv, K] the same channels of conv1d.weight [C, 1, K]
  TargetWeight w_z;               // [nv·dv, H] rows of in_proj_z (output gate)
  TargetWeight w_b, w_a;          // [nv, H] rows of in_proj_b (β), in_proj_a (decay)
  TargetWeight a_log, dt_bias;    // [nv]
  TargetWeight gated_norm;        // [dv] linear_attn.norm.weight (plain w)
  TargetWeight w_out;             // [H, nv·dv] columns of out_proj
};

// What an incremental forward carries between calls for one sequence on one rank, in the memory of the backend of
// the TargetModel that filled it: per full attention layer the keys and values of every position so far (this
// rank's KV heads, after k_norm and RoPE), per Gated DeltaNet layer the last K−1 rows of its conv input and its
// recurrent state. Default-constructed = a fresh sequence (the buffers are made by the first forward_cached).
// Move-only; TargetModel::copy_cache copies one. The attention buffers hold `capacity` positions, of which the first
// `length` are valid: appending grows them geometrically (a decode appends one block at a time), truncating only
// lowers `length` (TargetCache::truncate).
struct TargetCache {
  int length = 0;                       // positions already processed
  int capacity = 0;                     // positions the attention buffers have room for (≥ length)
  std::vector<Buffer> keys, values;     // [layer] → [capacity, kv_count, head_dim]; empty for a DeltaNet layer
  std::vector<Buffer> conv_tail;        // [layer] → [K−1, local conv channels] (zeros before position 0)
  std::vector<Buffer> delta_state;      // [layer] → [local value heads, dk, dv]; both empty for an attention layer

  // Drops positions ≥ new_length from every attention layer (0 ≤ new_length ≤ length, else a dflash::Error). The
  // DeltaNet layers' recurrent part cannot be truncated: a rollback restores a snapshot of it (restore_recurrent).
  void truncate(int new_length);
};

// A copy of the Gated DeltaNet part of a TargetCache (conv tails, recurrent states) in the backend's memory: what a
// speculative decoder's rollback restores. Empty for a dense target.
struct TargetRecurrentState {
  std::vector<Buffer> conv_tail, delta_state;  // [layer], as in TargetCache
};

// Which array of one layer of a TargetCache read_cache returns.
enum class TargetCachePart { keys, values, conv_tail, delta_state };

class TargetModel {
 public:
  // Loads this rank's slices of the Hugging Face model in `model_dir` (config.json + model.safetensors or index)
  // for the TP group `tp` (rank tp.rank() of tp.size()). `tp` must outlive the model.
  TargetModel(const std::string& model_dir, comm::Transport& tp, TargetOptions options = {});

  const QwenConfig& config() const { return config_; }
  const TargetShard& shard() const { return shard_; }
  const TargetStats& stats() const { return stats_; }
  kernels::Backend<float>& backend() const { return *backend_; }
  void reset_stats() { stats_ = {}; }
  size_t weight_bytes() const;  // fp32 bytes of the slices held (in the backend's memory)

  // Collective over the TP group (every rank passes the same tokens). Positions 0..S-1.
  // taps[S, n_taps*H] (=): columns [t*H, (t+1)*H) = output of decoder layer tap_layer_ids[t] (0-based);
  // final_hidden[S, H] (=): final RMSNorm of the last layer's output. Either may be null to skip it.
  // A token outside [0, vocab) or a layer id outside [0, layers) is a dflash::Error naming it.
  void forward(const int32_t* tokens, int S, const std::vector<int>& tap_layer_ids, float* taps,
               float* final_hidden);

  // Collective. tokens[n] at positions cache.length .. cache.length + n − 1, after everything `cache` holds (a
  // default-constructed cache starts a sequence); appends them to the cache. final_hidden[n, H] (=) the final
  // normed state of those positions, the same as forward() over the whole sequence gives for them (to rounding).
  void forward_cached(const int32_t* tokens, int n, TargetCache& cache, float* final_hidden);
  // The same, also writing taps[n, n_taps*H] (=) of those positions as forward() does (speculative decoding).
  void forward_cached(const int32_t* tokens, int n, TargetCache& cache, const std::vector<int>& tap_layer_ids,
                      float* taps, float* final_hidden);
  // Collective. Tree verification (docs/eval.md): tokens[n] are the nodes of a tree of candidates hanging after
  // the cache, node 0 its root; parents[n]: parents[0] = −1, 0 ≤ parents[i] < i. Node i sits at position
  // cache.length + depth(i) and attends to the cache and its own ancestors (itself included), so its final_hidden
  // row [n, H] (=) and taps row [n, n_taps·H] (=) are what forward_cached would give after the cache and its
  // root-to-node path. The n nodes' keys/values are appended to the cache in node order (cache.length += n); the
  // caller keeps one path (lib/model/spec_tree.h). Dense targets only: a Gated DeltaNet layer's recurrent state
  // cannot branch within one forward (a dflash::Error). CPU backend only (the tree attention is a CPU kernel,
  // kernels/cpu/attention_tree.h): a device backend is a dflash::Error.
  void forward_tree(const int32_t* tokens, const int* parents, int n, TargetCache& cache,
                    const std::vector<int>& tap_layer_ids, float* taps, float* final_hidden);

  // Cache operations on this model's backend (device copies on CUDA; a cache filled by another backend's target is
  // a dflash::Error). copy_cache: an independent copy (the same length, capacity = length).
  TargetCache copy_cache(const TargetCache& cache) const;
  // state (=) the recurrent part of `cache` (buffers reused when state already holds them); restore_recurrent puts
  // it back. A fresh cache or a dense target: nothing to copy (state stays empty; restoring empty leaves the cache).
  void save_recurrent(const TargetCache& cache, TargetRecurrentState& state) const;
  void restore_recurrent(TargetCache& cache, const TargetRecurrentState& state) const;
  // After a forward_tree at cache length past + n: keeps the past positions and the nodes path[0..m) (path[0] = 0,
  // the root; each the child of the one before; path[d] ≥ d) as positions past..past+m−1 (length = past + m).
  void keep_cache_path(TargetCache& cache, int past, const std::vector<int>& path) const;
  // A host copy of one layer's array: keys/values [length, kv_count, head_dim], conv_tail [K−1, channels],
  // delta_state [value heads, dk, dv]; empty where the layer has no such array (or the cache is fresh). For tests.
  std::vector<float> read_cache(const TargetCache& cache, int layer, TargetCachePart part) const;

 private:
  // positions start at cache ? cache->length : 0 (plus the node's depth in a tree); cache (optional) is read and
  // extended; tree_parents (optional, with cache): the rows are the nodes of a tree (forward_tree)
  void run(const int32_t* tokens, int S, const std::vector<int>& tap_layer_ids, float* taps, float* final_hidden,
           TargetCache* cache, const int* tree_parents = nullptr);
  // the cache holds per-layer buffers (made on a fresh cache) with room for n more positions (grown geometrically)
  void prepare_cache(TargetCache& cache, int n, const char* what);
  void load_layer(int l);
  // host floats → a weight in the backend's memory
  TargetWeight upload(const std::vector<float>& host);
  // the activation arena holds at least `bytes` (reallocated, empty, when smaller)
  void reserve_activations(size_t bytes);
  void load_attention(int l, TargetLayer& L);
  void load_linear_attention(int l, TargetLayer& L);
  // all-reduce of part[n] in backend memory over the TP group (host transport; device: staged through the host)
  void timed_allreduce(float* part, size_t n);

  std::string dir_;
  comm::Transport& tp_;
  TargetOptions options_;
  std::shared_ptr<kernels::Backend<float>> backend_;  // declared before the weights, which live in its memory
  QwenConfig config_;
  TargetShard shard_;
  io::Checkpoint ckpt_;            // kept open: embedding rows are read per forward
  std::vector<TargetLayer> layers_;
  TargetWeight final_norm_;        // [H]
  Arena activations_;              // one forward's activations and scratch (backend memory)
  std::vector<float> host_stage_;  // [S, H] host staging: embedding rows, taps, all-reduce (device backends)
  TargetStats stats_;
};

// HF tensor name of layer l's `what` (".weight" appended) under the config's weight prefix.
std::string target_layer_tensor(const QwenConfig& c, int l, const std::string& what);

// The target's vocabulary matrices as fp32, for drafter ranks: embedding [V, H] and lm_head [V, H]
// (tied checkpoints: lm_head is the embedding, stored once). Reads nothing else from the checkpoint.
struct TargetVocab {
  int vocab = 0, hidden = 0;
  bool tied = false;
  std::vector<float> embedding;  // [V, H]
  std::vector<float> lm_head_untied;  // [V, H]; empty when tied
  const float* lm_head() const { return tied ? embedding.data() : lm_head_untied.data(); }
};
TargetVocab load_target_vocab(const std::string& model_dir);

}  // namespace dflash::model
