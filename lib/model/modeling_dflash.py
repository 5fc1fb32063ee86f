# modeling_dflash.py - written by dflash_mpi's export (the drafter's forward for transformers).
"""The DFlash drafter of a dflash_mpi export, as PyTorch modules that transformers loads:

    from transformers import AutoModel
    drafter = AutoModel.from_pretrained("my-drafter", trust_remote_code=True, dtype=torch.float32)

The export (`dflash_mpi --export`, docs/export.md) writes this file next to config.json and model.safetensors; it
computes exactly what the trainer's forward computes (dflash_mpi docs/drafter.md, lib/model/drafter.cpp), written
from that definition:

    ctx     = hidden_norm(fc(target_hidden))          [b, S, H]    context rows at positions 0..S-1
    x_0     = inputs_embeds                           [b, N*B, H]  row n*B + j: block n's position j
    x_{l+1} = layer_l(x_l, ctx)                       Q from the block rows; K/V from [ctx ; the block's own rows]
    out     = norm(x_L)                               [b, N*B, H]  the target's lm_head turns it into the drafts

Block n starts at `anchors[n]` (= a): its rows sit at positions a + j (j = 0..B-1) and its input is the target's
embedding of [the token at a, mask_token_id x (B-1)]. Rows j >= 1 predict the tokens at a + j. The mask of query
row j of block n:

    full_attention layer:     context keys kv < a                          + every key of its block (bidirectional)
    sliding_attention layer:  context keys max(0, a + j - (w - 1)) <= kv < a  + its block's keys 0..j (causal)

The anchor's own context row (kv = a) is never visible: its target state already predicts the token at a + 1.

The drafter has no embedding and no lm_head: both are the target's (frozen in training), so `inputs_embeds` is
`target.get_input_embeddings()(block_ids)` and the logits are `target.lm_head(out)`. `target_hidden` is the
concatenation, in `config.target_layer_ids` order, of the target's hidden states after those decoder layers
(transformers' `output_hidden_states=True` gives them as `hidden_states[l + 1]`).

This is a reference forward (every block against the whole context, no KV cache): what a serving engine must
reproduce, and enough to draft with on small contexts.
"""
import torch
from torch import nn
from torch.nn import functional as F
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


class DFlashConfig(PretrainedConfig):
    """config.json of a dflash_mpi export (docs/export.md lists every key). The layers are Qwen3 decoder layers, so
    the file says model_type "qwen3" (what engines with DFlash support read); the DFlash facts are `block_size`,
    `num_target_layers` and `dflash_config` = {mask_token_id, target_layer_ids}."""

    model_type = "qwen3"

    def __init__(self, vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=1,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
                 max_position_embeddings=40960, hidden_act="silu", attention_bias=False, use_sliding_window=False,
                 sliding_window=None, layer_types=None, block_size=16, num_target_layers=36, dflash_config=None,
                 initializer_range=0.02, tie_word_embeddings=False, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.max_position_embeddings = max_position_embeddings
        self.hidden_act = hidden_act
        self.attention_bias = attention_bias
        self.use_sliding_window = use_sliding_window
        self.sliding_window = sliding_window
        self.layer_types = list(layer_types) if layer_types is not None else [FULL_ATTENTION] * num_hidden_layers
        self.block_size = block_size
        self.num_target_layers = num_target_layers
        self.dflash_config = dict(dflash_config) if dflash_config is not None else {
            "mask_token_id": vocab_size - 1, "target_layer_ids": [num_target_layers - 1]}
        self.initializer_range = initializer_range
        self._check()
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    def _check(self):
        def need(ok, what):
            if not ok:
                raise ValueError(f"DFlashConfig: {what}")
        need(self.hidden_act == "silu", f"hidden_act is {self.hidden_act!r}; the drafter's MLP is SwiGLU ('silu')")
        need(not self.attention_bias, "attention_bias is true; the drafter's projections have no bias")
        need(self.num_attention_heads % self.num_key_value_heads == 0,
             f"num_attention_heads {self.num_attention_heads} is not a multiple of num_key_value_heads "
             f"{self.num_key_value_heads}")
        need(self.head_dim % 2 == 0, f"head_dim {self.head_dim} is odd (RoPE rotates pairs)")
        need(self.block_size >= 2, f"block_size {self.block_size} < 2")
        need(len(self.layer_types) == self.num_hidden_layers,
             f"{len(self.layer_types)} layer_types for num_hidden_layers={self.num_hidden_layers}")
        for t in self.layer_types:
            need(t in (FULL_ATTENTION, SLIDING_ATTENTION), f"layer_types has {t!r}")
            need(t == FULL_ATTENTION or (self.use_sliding_window and isinstance(self.sliding_window, int)
                                         and self.sliding_window > 0),
                 "a sliding_attention layer needs use_sliding_window true and a positive sliding_window")
        need(len(self.target_layer_ids) > 0, "dflash_config.target_layer_ids is empty")

    @property
    def target_layer_ids(self):
        """The tapped target layers, in the order fc reads them (layer l = the output of decoder layer l)."""
        return list(self.dflash_config["target_layer_ids"])

    @property
    def mask_token_id(self):
        """The vocabulary row fed at block positions 1..B-1."""
        return int(self.dflash_config["mask_token_id"])

    def layer_window(self, layer):
        """0 for a full-attention layer, else its sliding window w."""
        return self.sliding_window if self.layer_types[layer] == SLIDING_ATTENTION else 0


def as_dflash_config(config):
    """`config` as a DFlashConfig. config.json's auto_map names only AutoModel, as z-lab's published drafters do, so
    AutoConfig (and an engine started with trust_remote_code) parses it as the Qwen3Config of its model_type; the
    model then takes every key it needs from that (transformers 5 keeps RoPE's base in rope_parameters)."""
    if isinstance(config, DFlashConfig):
        return config
    d = config.to_dict()
    theta = d.get("rope_theta")
    if theta is None:
        theta = (d.get("rope_parameters") or {}).get("rope_theta")
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "hidden_act",
            "attention_bias", "use_sliding_window", "sliding_window", "layer_types", "block_size",
            "num_target_layers", "dflash_config", "initializer_range", "tie_word_embeddings")
    missing = [k for k in ("block_size", "num_target_layers", "dflash_config") if k not in d]
    if missing or theta is None:
        raise ValueError(f"DFlashConfig: the config lacks {missing + ([] if theta is not None else ['rope_theta'])}: "
                         "not a DFlash drafter's config.json")
    out = DFlashConfig(rope_theta=theta, **{k: d[k] for k in keys if k in d})
    if d.get("dtype") is not None:
        out.dtype = d["dtype"]
    return out


class DFlashRMSNorm(nn.Module):
    """y = x * rsqrt(mean(x^2) + eps) * weight over the last axis; bf16/f16 inputs are normalised in float32."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        xc = x.float() if dtype in (torch.float16, torch.bfloat16) else x
        y = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.to(y.dtype)).to(dtype)


def rope_cos_sin(positions, head_dim, theta, dtype):
    """cos, sin [..., head_dim/2] of positions * theta^(-2i/head_dim), the angles in float64."""
    i = torch.arange(head_dim // 2, dtype=torch.float64, device=positions.device)
    angle = positions.to(torch.float64)[..., None] * torch.pow(torch.tensor(float(theta), dtype=torch.float64),
                                                             -2.0 * i / head_dim)
    return angle.cos().to(dtype), angle.sin().to(dtype)


def apply_rope(x, cos, sin):
    """Rotates the pairs (x[i], x[i + D/2]) of x [..., heads, D] by the angles of cos, sin [..., D/2]."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[..., None, :], sin[..., None, :]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


class DFlashMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashAttention(nn.Module):
    """Q from the block rows; K and V from the context rows and the block's own rows with the same k/v weights;
    q_norm / k_norm per head, then RoPE (block rows at a + j, context rows at their own positions)."""

    def __init__(self, config, layer):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (config.num_attention_heads, config.num_key_value_heads,
                                                    config.head_dim)
        H, Q, KV = config.hidden_size, self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.q_proj = nn.Linear(H, Q, bias=False)
        self.k_proj = nn.Linear(H, KV, bias=False)
        self.v_proj = nn.Linear(H, KV, bias=False)
        self.o_proj = nn.Linear(Q, H, bias=False)
        self.q_norm = DFlashRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = DFlashRMSNorm(self.head_dim, config.rms_norm_eps)
        self.window = config.layer_window(layer)

    def forward(self, x, ctx, rope, masks):
        """x [b, N*B, H] block rows, ctx [b, S, H]; rope = (block cos, sin [b, N*B, D/2], context cos, sin
        [b, S, D/2]); masks = the visible keys of each query row, per window (DFlashDraftModel.visible_keys)."""
        b, NB, _ = x.shape
        S = ctx.shape[1]
        KVH, D = self.kv_heads, self.head_dim
        G = self.heads // KVH
        ctx_visible, blk_visible = masks[self.window]  # [b, N, B, S], [B, B]
        N, B = ctx_visible.shape[1], ctx_visible.shape[2]
        blk_cos, blk_sin, ctx_cos, ctx_sin = rope
        q = apply_rope(self.q_norm(self.q_proj(x).view(b, NB, self.heads, D)), blk_cos, blk_sin)
        kb = apply_rope(self.k_norm(self.k_proj(x).view(b, NB, KVH, D)), blk_cos, blk_sin)
        vb = self.v_proj(x).view(b, NB, KVH, D)
        kc = apply_rope(self.k_norm(self.k_proj(ctx).view(b, S, KVH, D)), ctx_cos, ctx_sin)
        vc = self.v_proj(ctx).view(b, S, KVH, D)
        # query head h reads kv head h // G: group the G query heads of each kv head
        q = q.view(b, N, B, KVH, G, D).permute(0, 3, 4, 1, 2, 5)  # [b, KVH, G, N, B, D]
        kb, vb = (t.view(b, N, B, KVH, D).permute(0, 3, 1, 2, 4) for t in (kb, vb))  # [b, KVH, N, B, D]
        kc, vc = (t.permute(0, 2, 1, 3) for t in (kc, vc))  # [b, KVH, S, D]
        scale = 1.0 / D ** 0.5
        s_ctx = torch.einsum("bkgnjd,bksd->bkgnjs", q, kc) * scale
        s_blk = torch.einsum("bkgnjd,bknid->bkgnji", q, kb) * scale
        s_ctx = s_ctx.masked_fill(~ctx_visible[:, None, None], float("-inf"))
        s_blk = s_blk.masked_fill(~blk_visible, float("-inf"))
        scores = torch.cat([s_ctx, s_blk], dim=-1)  # every row sees at least its own block key: never all -inf
        low = scores.dtype in (torch.float16, torch.bfloat16)
        p = torch.softmax(scores.float() if low else scores, dim=-1).to(scores.dtype)
        out = (torch.einsum("bkgnjs,bksd->bkgnjd", p[..., :S], vc) +
               torch.einsum("bkgnji,bknid->bkgnjd", p[..., S:], vb))
        out = out.permute(0, 3, 4, 1, 2, 5).reshape(b, NB, self.heads * D)  # back to [b, N*B, NH*D]
        return self.o_proj(out)


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.input_layernorm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config, layer)
        self.post_attention_layernorm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DFlashMLP(config)

    def forward(self, x, ctx, rope, masks):
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope, masks)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(PreTrainedModel):
    """The drafter: fc + hidden_norm over the target taps, num_hidden_layers decoder layers, the final norm. Its
    parameter names are the export's tensor names (layers.{i}.self_attn.q_proj.weight, fc.weight, ...)."""

    config_class = DFlashConfig
    base_model_prefix = "dflash"
    main_input_name = "inputs_embeds"
    _no_split_modules = ["DFlashDecoderLayer"]
    supports_gradient_checkpointing = False

    def __init__(self, config):
        config = as_dflash_config(config)
        super().__init__(config)
        H = config.hidden_size
        self.fc = nn.Linear(len(config.target_layer_ids) * H, H, bias=False)
        self.hidden_norm = DFlashRMSNorm(H, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, l) for l in range(config.num_hidden_layers))
        self.norm = DFlashRMSNorm(H, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return None  # the target's: see block_input_ids

    def block_input_ids(self, anchor_tokens):
        """[..., N] tokens at the anchors -> [..., N*B] block input ids (each: the token, then mask_token_id x B-1),
        for the target's embedding."""
        B = self.config.block_size
        ids = torch.full((*anchor_tokens.shape, B), self.config.mask_token_id, dtype=anchor_tokens.dtype,
                         device=anchor_tokens.device)
        ids[..., 0] = anchor_tokens
        return ids.flatten(-2)

    def visible_keys(self, anchors, S):
        """{window: (ctx [b, N, B, S], block [B, B])} boolean masks of the keys each query row sees."""
        B = self.config.block_size
        j = torch.arange(B, device=anchors.device)
        kv = torch.arange(S, device=anchors.device)
        before_anchor = kv[None, None, None, :] < anchors[:, :, None, None]  # [b, N, 1, S]
        masks = {}
        for w in {self.config.layer_window(l) for l in range(self.config.num_hidden_layers)}:
            if w == 0:
                masks[w] = (before_anchor.expand(-1, -1, B, -1), torch.ones(B, B, dtype=torch.bool, device=j.device))
            else:
                first = (anchors[:, :, None] + j - (w - 1))[..., None]  # [b, N, B, 1]: the window's first key
                masks[w] = (before_anchor & (kv >= first), j[None, :] <= j[:, None])
        return masks

    def forward(self, target_hidden=None, inputs_embeds=None, anchors=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        """
        target_hidden  [b, S, n_taps*H]  the target's hidden states at config.target_layer_ids, concatenated, for
                                         context positions 0..S-1 (rows at or after a block's anchor are not read
                                         by that block; a batch may pad short contexts with anything)
        inputs_embeds  [b, N*B, H]       the target's embedding of block_input_ids(tokens at the anchors)
        anchors        [b, N] (int)      each block's first position a (0 <= a; a <= S for the context it reads)
        Unbatched [S, n_taps*H], [N*B, H], [N] work too. Returns BaseModelOutput: last_hidden_state [b, N*B, H] =
        norm(x_L) (what the target's lm_head reads; rows j >= 1 of each block are the drafts for a + j) and, with
        output_hidden_states, (x_0, ..., x_L) before the final norm.
        """
        if target_hidden is None or inputs_embeds is None or anchors is None:
            raise ValueError("DFlashDraftModel.forward needs target_hidden, inputs_embeds and anchors")
        unbatched = target_hidden.dim() == 2
        if unbatched:
            target_hidden, inputs_embeds, anchors = target_hidden[None], inputs_embeds[None], anchors[None]
        cfg = self.config
        b, S, W = target_hidden.shape
        anchors = torch.as_tensor(anchors, device=target_hidden.device).long()
        N, B, H = anchors.shape[-1], cfg.block_size, cfg.hidden_size
        if W != len(cfg.target_layer_ids) * H:
            raise ValueError(f"target_hidden has {W} features; {len(cfg.target_layer_ids)} taps x hidden {H} expected")
        if tuple(inputs_embeds.shape) != (b, N * B, H) or tuple(anchors.shape) != (b, N):
            raise ValueError(f"inputs_embeds {tuple(inputs_embeds.shape)} and anchors {tuple(anchors.shape)}: "
                             f"expected [{b}, N*{B}, {H}] and [{b}, N]")
        if bool((anchors < 0).any()):
            raise ValueError("anchors must be >= 0")
        dtype = self.fc.weight.dtype
        ctx = self.hidden_norm(self.fc(target_hidden.to(dtype)))
        blk_pos = (anchors[:, :, None] + torch.arange(B, device=anchors.device)).reshape(b, N * B)
        ctx_pos = torch.arange(S, device=anchors.device).expand(b, S)
        rope = (*rope_cos_sin(blk_pos, cfg.head_dim, cfg.rope_theta, dtype),
                *rope_cos_sin(ctx_pos, cfg.head_dim, cfg.rope_theta, dtype))
        masks = self.visible_keys(anchors, S)
        x = inputs_embeds.to(dtype)
        states = [x]
        for layer in self.layers:
            x = layer(x, ctx, rope, masks)
            states.append(x)
        out = self.norm(x)
        if unbatched:
            out, states = out[0], [s[0] for s in states]
        hidden = tuple(states) if output_hidden_states else None
        use_dict = return_dict if return_dict is not None else getattr(cfg, "return_dict", True)
        if not use_dict:
            return (out, hidden) if hidden is not None else (out,)
        return BaseModelOutput(last_hidden_state=out, hidden_states=hidden)


__all__ = ["DFlashConfig", "DFlashDraftModel"]
