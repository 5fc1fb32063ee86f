#pragma once
// The frozen Qwen target (dense Qwen3, or the Qwen3.5 / Qwen3.6 hybrids of Gated DeltaNet and gated full
// attention layers), tensor-parallel over one TP group, forward only, on a kernels::Backend<T> in the compute type
// the caller asks for (TargetOptions): fp32 on the CPU (the default) or CUDA, bf16 on CUDA (what the trainer's
// target ranks run with run.device cuda), fp64 on the CPU (a precise reference for tests).
//
// Per decoder layer (Megatron naming): column-parallel q/k/v (this rank's heads) and gate/up (its intermediate
// channels), row-parallel o/down (the matching input columns) each followed by one all-reduce of the [S, H]
// partial sums, after which every TP rank holds the full activations. Checkpoint tensors (bf16/f16/f32) are read
// as fp32 and rounded once to the compute type on load. Each rank reads only its own slices from the mmapped
// checkpoint; embedding rows are read per forward for the tokens at hand, so no rank keeps the [V, H] table.
//
// Precision: weights, activations and the residual stream are in T (as Hugging Face keeps them in the model dtype);
// RMSNorm statistics, the Gated DeltaNet gates g, β and its recurrent state in acc_t<T> (fp32 for bf16); GEMMs and
// reductions accumulate in fp32 at least. The outputs (taps, final hidden) are fp32 whatever T is.
//
// Where things live: the weights in the backend's memory (one Buffer per tensor, uploaded once at load), the
// activations of a forward in one arena of backend memory (grown to the largest forward seen); the embedding rows
// are read on the host and uploaded. Taps and final_hidden go to the caller's host arrays, or (the forward overload
// with MemoryKind) to arrays in the backend's memory, written there without a pass through the host. The
// row-parallel all-reduces run on the TP transport: on host memory directly; on device memory with the device
// pointer when the transport takes one (NCCL), else staged through the host (MPI). The TargetCache of an
// incremental decode lives in the backend's memory too; what the speculative decoders do to it (truncate,
// snapshot / restore of the recurrent part, keep a tree path) are TargetModel methods that run there.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "lib/comm/transport.h"
#include "lib/core/buffer.h"
#include "lib/io/safetensors.h"
#include "lib/model/qwen_config.h"
#include "lib/model/target_settings.h"
#include "lib/model/target_shard.h"

namespace dflash::model {

struct TargetOptions {
  int mlp_grain = 64;        // intermediate channels per shard unit (tile alignment)
  int attention_block = 64;  // query rows per attention block (scores held: block × S floats; CPU backend)
  // The compute type of weights and activations on `device`: a pair make_backend has (kernels/device.h: fp32 on
  // either, bf16 on CUDA, fp64 on the CPU: a reference for tests); another pair is its user error.
  kernels::Precision precision = kernels::Precision::fp32;
  // Where the forward runs: CUDA = device memory on the calling thread's current GPU.
  kernels::Device device = kernels::Device::cpu;
  // How a bf16 forward sums its TP partials on NCCL (layout.tp_allreduce; lib/model/target_settings.h).
  TpAllreduce tp_allreduce = TpAllreduce::bf16;
  // On a device backend: synchronise the stream before and after each part of the forward (embedding, each token
  // mixer, each MLP, the outputs), so that TargetStats' part timers hold the GPU's time, not the launches'. For
  // benchmarks (it serialises the parts with the host); off in training.
  bool sync_part_timing = false;
  // On a device backend over NCCL (Transport::orders_on_device_streams): each row-parallel all-reduce ordered on the
  // device by events (NCCL's stream waits for the compute stream's partial sums, the compute stream for the sum), so
  // the host queues on without waiting; it waits (bounded, the transport's watchdog) only where it reads results:
  // outputs copied to the host, an MoE layer's routing, the forward's end. false: the host-synchronised path (the
  // backend's stream synchronised, then NCCL's call returns when its own stream is done): the same bits, two host
  // round trips per all-reduce; kept for the tests that compare the two and for benchmarks.
  bool ordered_allreduce = true;
  // An fp32 backend to run on instead (tests share one; precision must be fp32, device is ignored). Weights and
  // activations are allocated in its memory.
  std::shared_ptr<kernels::Backend<float>> backend;
};

struct TargetStats {
  long forwards = 0;
  int64_t tokens = 0;
  double forward_seconds = 0;    // wall time inside forward()
  // wall time inside the row-parallel all-reduces (waiting included; stream-ordered ones: queueing only, unless
  // TargetOptions::sync_part_timing, which waits for each)
  double allreduce_seconds = 0;
  long allreduces = 0;
  // device backends: the times forward() made the host wait for the device (a stream synchronisation, a download,
  // an MoE layer's routing table, a host-blocking all-reduce, a wait for stream-ordered all-reduces)
  long host_waits = 0;
  // compute inside forward() by layer part (all-reduces excluded): the token mixer of Gated DeltaNet layers, of full
  // attention layers, and the MLP (its norm included)
  double linear_attention_seconds = 0, full_attention_seconds = 0, mlp_seconds = 0;
  // with TargetOptions::sync_part_timing: the embedding (and position upload) and the tap / final-hidden outputs
  double embed_seconds = 0, output_seconds = 0;
  int64_t expert_rows = 0;  // MoE: (token, expert) rows this rank's experts computed, all layers (load balance)
  // the activation arena: the bytes the last forward's arrays and largest token-mixer scratch take (what it is sized
  // to), and the most it has held since it was last made (remade larger when a forward needs more)
  size_t activation_bytes = 0, activation_peak_bytes = 0;
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
  // elements in the target's compute type T, the recurrent state in acc_t<T>
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
// Bytes of the activation arena one forward of S positions takes on `shard` in `precision` on a device backend
// (device) or the CPU: the forward's arrays and its largest token mixer's scratch, metered over the same lists the
// forward binds its pointers from (TargetStats::activation_bytes after a forward).
size_t target_activation_bytes(const QwenConfig& c, const TargetShard& shard, int S, kernels::Precision precision,
                               bool device);

class TargetModel {
 public:
  // Loads this rank's slices of the Hugging Face model in `model_dir` (config.json + model.safetensors or index)
  // for the TP group `tp` (rank tp.rank() of tp.size()), in options.precision on the backend options ask for.
  // `tp` must outlive the model.
  TargetModel(const std::string& model_dir, comm::Transport& tp, TargetOptions options = {});
  ~TargetModel();
  TargetModel(TargetModel&&) noexcept;
  TargetModel& operator=(TargetModel&&) noexcept;

  const QwenConfig& config() const;
  const TargetShard& shard() const;
  const TargetStats& stats() const;
  void reset_stats();
  const char* backend_name() const;  // "cpu" or "cuda"
  const char* precision() const;     // the compute type: "fp32", "bf16" or "fp64"
  MemoryKind memory() const;         // where weights, activations, caches (and backend-memory outputs) live
  size_t weight_bytes() const;       // bytes of the slices held (in the backend's memory, in the compute type)

  // Collective over the TP group (every rank passes the same tokens). Positions 0..S-1.
  // taps[S, n_taps*H] (=): columns [t*H, (t+1)*H) = output of decoder layer tap_layer_ids[t] (0-based);
  // final_hidden[S, H] (=): final RMSNorm of the last layer's output. Either may be null to skip it. Both fp32, in
  // host memory. A token outside [0, vocab) or a layer id outside [0, layers) is a dflash::Error naming it.
  void forward(const int32_t* tokens, int S, const std::vector<int>& tap_layer_ids, float* taps,
               float* final_hidden);
  // The same with taps and final_hidden in `outputs` memory: MemoryKind::device (the backend's memory on a CUDA
  // target: the features stay on the GPU, each tap converted into its columns there) or MemoryKind::host (the
  // overload above). On the CPU backend both are host memory and the results are the same bits. Complete (the
  // backend synchronized) when it returns. Device outputs on a CPU target are a dflash::Error.
  void forward(const int32_t* tokens, int S, const std::vector<int>& tap_layer_ids, float* taps,
               float* final_hidden, MemoryKind outputs);

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
  // caller keeps one path (lib/eval/spec_tree.h). Dense targets only: a Gated DeltaNet layer's recurrent state
  // cannot branch within one forward (a dflash::Error). CPU backend only (the tree attention is a CPU kernel,
  // kernels/cpu/attention_tree.h): a device backend is a dflash::Error.
  void forward_tree(const int32_t* tokens, const int* parents, int n, TargetCache& cache,
                    const std::vector<int>& tap_layer_ids, float* taps, float* final_hidden);

  // Cache operations on this model's backend (device copies on CUDA; a cache filled by another backend's or
  // another precision's target is a dflash::Error). copy_cache: an independent copy (the same length,
  // capacity = length).
  TargetCache copy_cache(const TargetCache& cache) const;
  // state (=) the recurrent part of `cache` (buffers reused when state already holds them); restore_recurrent puts
  // it back. A fresh cache or a dense target: nothing to copy (state stays empty; restoring empty leaves the cache).
  void save_recurrent(const TargetCache& cache, TargetRecurrentState& state) const;
  void restore_recurrent(TargetCache& cache, const TargetRecurrentState& state) const;
  // After a forward_tree at cache length past + n: keeps the past positions and the nodes path[0..m) (path[0] = 0,
  // the root; each the child of the one before; path[d] ≥ d) as positions past..past+m−1 (length = past + m).
  void keep_cache_path(TargetCache& cache, int past, const std::vector<int>& path) const;
  // A host fp32 copy of one layer's array: keys/values [length, kv_count, head_dim], conv_tail [K−1, channels],
  // delta_state [value heads, dk, dv]; empty where the layer has no such array (or the cache is fresh). For tests.
  std::vector<float> read_cache(const TargetCache& cache, int layer, TargetCachePart part) const;

  class Engine;  // the model in one compute type (target.cpp)

 private:
  std::unique_ptr<Engine> engine_;
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
