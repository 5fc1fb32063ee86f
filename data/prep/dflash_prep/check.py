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
import json
import os
from typing import Optional

import numpy as np


@dataclass
class TargetInfo:
    path: str
    vocab: int
    eos_ids: set = field(default_factory=set)
    bos_id: Optional[int] = None


def _ids(v) -> set:
    if v is None:
        return set()
    return {int(x) for x in (v if isinstance(v, list) else [v])}


def read_target(model_dir: str) -> TargetInfo:
    cfg_path = os.path.join(model_dir, "config.json")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise SystemExit(f"error: {cfg_path} not found: --target must be the target's model directory "
                         "(the one with config.json)") from None
    except json.JSONDecodeError as e:
        raise SystemExit(f"error: {cfg_path}: not valid JSON ({e})") from None
    text_cfg = cfg.get("text_config", cfg)   # multimodal configs keep the language model's keys there
    vocab = text_cfg.get("vocab_size", cfg.get("vocab_size"))
    if not isinstance(vocab, int) or vocab <= 0:
        raise SystemExit(f"error: {cfg_path}: no positive integer 'vocab_size'")
    info = TargetInfo(model_dir, vocab, _ids(text_cfg.get("eos_token_id", cfg.get("eos_token_id"))),
                      text_cfg.get("bos_token_id", cfg.get("bos_token_id")))
    gen_path = os.path.join(model_dir, "generation_config.json")
    if os.path.exists(gen_path):
        with open(gen_path, encoding="utf-8") as f:
            info.eos_ids |= _ids(json.load(f).get("eos_token_id"))
    return info


def check_tokenizer(tok, tok_dir: str, target: TargetInfo) -> list:
    """Errors (strings) of a tokenizer against a target; empty when it fits."""
    errors = []
    n_tok = len(tok)
    if n_tok > target.vocab:
        errors.append(f"the tokenizer in {tok_dir} has {n_tok} tokens but the target {target.path} has vocab_size "
                      f"{target.vocab}: it is another model's tokenizer (use the target's own tokenizer)")
    specials = {i: t.content for i, t in tok.added_tokens_decoder.items() if t.special}
    for name, ids in (("eos_token_id", target.eos_ids), ("bos_token_id", _ids(target.bos_id))):
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
        theirs = Tokenizer.from_file(own).get_vocab(with_added_tokens=True)
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
    errors = []
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        return [f"{path}: cannot open as HDF5 ({e})"], ""
    with f:
        for name in ("tokens", "offsets", "loss_mask"):
            if name not in f:
                return [f"{path}: no dataset '{name}' (format: data/README.md)"], ""
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
