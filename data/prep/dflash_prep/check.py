"""Does a tokenizer fit a target model, and does a dataset fit both?

Checks (each failure is a message that names the file, the value and the fix):
  - the tokenizer has no more tokens than the target's vocab_size (config.json; Qwen3 pads its embedding to
    151936 rows while the tokenizer has 151669 tokens: the rows in between are reserved, e.g. the drafter's
    mask token 151669);
  - the target's eos / bos ids (config.json, generation_config.json) are special tokens of the tokenizer with the
    same ids, and the tokenizer's eos is one of the target's eos ids;
  - when the target directory has its own tokenizer.json: the same vocabulary (token -> id) as the tokenizer;
  - the mask token id is inside the vocab and, when the tokenizer can produce it, said so;
  - the data (HDF5): every id < vocab_size and < the tokenizer's size, the mask token never occurs.
"""
from dataclasses import dataclass, field
import os
from typing import Optional

import numpy as np

from .jsonfile import read_json_object, short


@dataclass
class TargetInfo:
    path: str
    vocab: int
    eos_ids: set = field(default_factory=set)
    bos_id: Optional[int] = None


def _is_id(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _ids(v, path: str, key: str) -> set:
    """A token id or a list of them (config.json's eos_token_id); exits naming the file and key otherwise."""
    if v is None:
        return set()
    items = v if isinstance(v, list) else [v]
    if not all(_is_id(x) for x in items):
        raise SystemExit(f"error: {path}: '{key}' must be a token id (a non-negative integer) or a list of them, "
                         f"got {short(v)}")
    return set(items)


def read_target(model_dir: str) -> TargetInfo:
    cfg_path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(cfg_path):
        raise SystemExit(f"error: {cfg_path} not found: --target must be the target's model directory "
                         "(the one with config.json)")
    cfg = read_json_object(cfg_path, "the target's config")
    text_cfg = cfg.get("text_config", cfg)   # multimodal configs keep the language model's keys there
    if not isinstance(text_cfg, dict):
        raise SystemExit(f"error: {cfg_path}: 'text_config' must be an object, got {short(text_cfg)}")
    vocab = text_cfg.get("vocab_size", cfg.get("vocab_size"))
    if not _is_id(vocab) or vocab == 0:
        raise SystemExit(f"error: {cfg_path}: no positive integer 'vocab_size' (got {short(vocab)})")
    bos = text_cfg.get("bos_token_id", cfg.get("bos_token_id"))
    if bos is not None and not _is_id(bos):
        raise SystemExit(f"error: {cfg_path}: 'bos_token_id' must be a token id (a non-negative integer) or null, "
                         f"got {short(bos)}")
    info = TargetInfo(model_dir, vocab, _ids(text_cfg.get("eos_token_id", cfg.get("eos_token_id")), cfg_path,
                                             "eos_token_id"), bos)
    gen_path = os.path.join(model_dir, "generation_config.json")
    if os.path.exists(gen_path):
        gen = read_json_object(gen_path, "the target's generation config")
        info.eos_ids |= _ids(gen.get("eos_token_id"), gen_path, "eos_token_id")
    return info


def check_tokenizer(tok, tok_dir: str, target: TargetInfo) -> list:
    """Errors (strings) of a tokenizer against a target; empty when it fits."""
    errors = []
    n_tok = len(tok)
    if n_tok > target.vocab:
        errors.append(f"the tokenizer in {tok_dir} has {n_tok} tokens but the target {target.path} has vocab_size "
                      f"{target.vocab}: it is another model's tokenizer (use the target's own tokenizer)")
    specials = {i: t.content for i, t in tok.added_tokens_decoder.items() if t.special}
    bos = set() if target.bos_id is None else {target.bos_id}
    for name, ids in (("eos_token_id", target.eos_ids), ("bos_token_id", bos)):
        for i in sorted(ids):
            if i >= target.vocab:
                errors.append(f"{target.path}/config.json: {name} {i} >= vocab_size {target.vocab}")
            elif i not in specials:
                errors.append(f"{target.path}: {name} {i} is not a special token of the tokenizer in {tok_dir} "
                              f"(the tokenizer's token {i} is {tok.convert_ids_to_tokens(i)!r}): tokenizer and "
                              "target do not match")
    if target.eos_ids and tok.eos_token_id is not None and tok.eos_token_id not in target.eos_ids:
        errors.append(f"the tokenizer's eos token {tok.eos_token!r} (id {tok.eos_token_id}) is not among the target's "
                      f"eos ids {sorted(target.eos_ids)} ({target.path}/config.json, generation_config.json)")
    own = os.path.join(target.path, "tokenizer.json")
    if os.path.exists(own) and os.path.realpath(own) != os.path.realpath(os.path.join(tok_dir, "tokenizer.json")):
        from tokenizers import Tokenizer
        try:
            theirs = Tokenizer.from_file(own).get_vocab(with_added_tokens=True)
        except Exception as e:   # the tokenizers library raises its own Exception type with serde's text
            return errors + [f"{own}: not a readable tokenizer ({e}); the file is damaged (fetch it again)"]
        ours = tok.get_vocab()
        if theirs != ours:
            diff = [k for k in ours if theirs.get(k) != ours[k]][:3]
            errors.append(f"the tokenizer in {tok_dir} differs from the target's own {own} "
                          f"({len(ours)} vs {len(theirs)} tokens; e.g. {diff}): use the target's tokenizer")
    return errors


def check_mask_token(tok, mask_token_id: int, target: TargetInfo) -> tuple:
    """(errors, notes) for the drafter's mask_token_id."""
    if not 0 <= mask_token_id < target.vocab:
        return [f"mask_token_id {mask_token_id} is outside the target vocabulary [0, {target.vocab})"], []
    if mask_token_id < len(tok):
        return [], [f"mask_token_id {mask_token_id} is the tokenizer's token "
                    f"{tok.convert_ids_to_tokens(mask_token_id)!r}: data may contain it (rows that do are "
                    "rejected); a reserved row >= {} would never occur".format(len(tok))]
    return [], []


def scan_data(path: str, vocab: int, n_tok: int, mask_token_id: Optional[int]) -> tuple:
    """(errors, summary) of an HDF5 dataset's token ids, read in chunks."""
    import h5py
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        return [f"{path}: cannot open as HDF5 ({e})"], ""
    with f:
        for name in ("tokens", "offsets", "loss_mask"):
            ds = f.get(name)
            if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.dtype.kind not in "iub":
                return [f"{path}: no 1-D integer dataset '{name}' (format: data/README.md)"], ""
        try:
            return _scan(path, f, vocab, n_tok, mask_token_id)
        except (OSError, ValueError) as e:   # h5py: a damaged chunk, a failed read
            return [f"{path}: cannot read the data ({e}); the file is damaged"], ""


def _scan(path, f, vocab, n_tok, mask_token_id) -> tuple:
    errors = []
    tokens, offsets = f["tokens"], f["offsets"][:]
    max_id, n_mask, first_mask = -1, 0, None
    step = 1 << 22
    for at in range(0, tokens.shape[0], step):
        chunk = tokens[at:at + step]
        max_id = max(max_id, int(chunk.max()))
        hits = np.nonzero(chunk == mask_token_id)[0] if mask_token_id is not None else []
        if len(hits) and first_mask is None:
            first_mask = at + int(hits[0])
        n_mask += len(hits)
    n_seq = len(offsets) - 1
    if max_id >= vocab:
        errors.append(f"{path}: token id {max_id} >= the target's vocab_size {vocab}: tokenized for another model")
    elif max_id >= n_tok:
        errors.append(f"{path}: token id {max_id} >= the tokenizer's {n_tok} tokens: not made with this tokenizer")
    if n_mask:
        seq = int(np.searchsorted(offsets, first_mask, side="right")) - 1
        errors.append(f"{path}: the mask token {mask_token_id} occurs {n_mask} times (first in sequence {seq}): the "
                      "drafter could not tell it from a masked position; re-tokenize with --mask-token-id to reject "
                      "those rows, or pick a reserved mask_token_id")
    return errors, f"{n_seq} sequences, {tokens.shape[0]} tokens, largest id {max_id}"
