"""Train the tiny real language model that ships with awq_inductor (``awq_inductor/data/tiny_llama``).

A Llama-architecture model (LlamaForCausalLM: hidden 256, intermediate 768, 4 layers, 4 query heads
of 64 dims sharing 2 key/value heads) with a byte-level BPE tokenizer (2048 tokens, built with the
``tokenizers`` package), trained on text that ships with every Python: the top-level ``*.py`` files
of the standard library (``sysconfig.get_paths()["stdlib"]``), sorted by name; every 10th file
(index % 10 == 5) is held out. Everything is seeded and runs in a fixed order.

    python benchmarks/train_tiny_llama.py                      # writes awq_inductor/data/tiny_llama
    python benchmarks/train_tiny_llama.py --steps 20 --out /tmp/x   # a quick smoke run

Writes: ``model.safetensors`` (bf16), ``config.json``, ``generation_config.json``, the tokenizer files
(``tokenizer.json``, ``tokenizer_config.json``) loadable by ``AutoTokenizer``, ``heldout.txt`` (a short
held-out text the tests and the report evaluate on, so they do not depend on the Python version's
stdlib) and ``training.json`` (files, settings, losses, held-out and unigram perplexities).

All dimensions suit the int4 kernels: every K (256, 768) is a multiple of each G in {32, 64, 128} and
every N (128, 256, 768) of 32.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import sysconfig
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(os.path.dirname(HERE), "awq_inductor", "data", "tiny_llama")
EOS = "<|endoftext|>"
MODEL = dict(vocab_size=2048, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
             rope_theta=10000.0, tie_word_embeddings=False)


def stdlib_files():
    """(train files, held-out files): the stdlib's top-level .py files, sorted; index % 10 == 5 held out."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "*.py")), key=os.path.basename)
    train = [f for i, f in enumerate(files) if i % 10 != 5]
    held = [f for i, f in enumerate(files) if i % 10 == 5]
    return train, held


def read(files):
    out = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            out.append(fh.read())
    return out


def build_tokenizer(texts, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS,
                                   pad_token=EOS, model_max_length=MODEL["max_position_embeddings"])


def encode_docs(tok, texts):
    eos = tok.convert_tokens_to_ids(EOS)
    ids = []
    for t in texts:
        ids.extend(tok(t, add_special_tokens=False)["input_ids"])
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


@torch.no_grad()
def perplexity(model, ids, seq_len, max_windows=None):
    """exp(mean NLL) over non-overlapping windows of ``seq_len`` tokens (each predicts tokens 1..L-1)."""
    model.eval()
    n = (ids.numel() - 1) // seq_len
    if max_windows:
        n = min(n, max_windows)
    x = ids[: n * seq_len].view(n, seq_len)
    nll, cnt = 0.0, 0
    for b in x.split(16):
        logits = model(b).logits.float()
        lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, b[:, 1:, None]).squeeze(-1)
        nll -= lp.sum().item()
        cnt += lp.numel()
    model.train()
    return math.exp(nll / cnt)


def unigram_perplexity(train_ids, held_ids, vocab):
    counts = torch.bincount(train_ids, minlength=vocab).double() + 1.0  # add-one smoothing
    logp = torch.log(counts / counts.sum())
    return math.exp(-logp[held_ids].mean().item())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--heldout-chars", type=int, default=6000, help="size of heldout.txt (default 6000)")
    args = p.parse_args(argv)

    import transformers

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    t_start = time.time()

    train_files, held_files = stdlib_files()
    train_texts, held_texts = read(train_files), read(held_files)
    print(f"python {sys.version.split()[0]}: {len(train_files)} train files "
          f"({sum(map(len, train_texts)) / 1e6:.2f} M chars), {len(held_files)} held-out files "
          f"({sum(map(len, held_texts)) / 1e6:.2f} M chars)", flush=True)
    tok = build_tokenizer(train_texts, MODEL["vocab_size"])
    train_ids, held_ids = encode_docs(tok, train_texts), encode_docs(tok, held_texts)
    print(f"tokens: train {train_ids.numel()}, held-out {held_ids.numel()} "
          f"({sum(map(len, held_texts)) / held_ids.numel():.2f} chars/token)", flush=True)
    uni = unigram_perplexity(train_ids, held_ids, MODEL["vocab_size"])
    print(f"unigram held-out perplexity: {uni:.2f}", flush=True)

    eos = tok.convert_tokens_to_ids(EOS)
    cfg = transformers.LlamaConfig(**MODEL, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    model = transformers.LlamaForCausalLM(cfg).float().train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    warm = max(args.steps // 20, 1)

    def lr_at(step):
        if step < warm:
            return args.lr * (step + 1) / warm
        t = (step - warm) / max(args.steps - warm, 1)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    g = torch.Generator().manual_seed(args.seed)
    L = args.seq_len
    history = []
    t0 = time.time()
    for step in range(args.steps):
        starts = torch.randint(0, train_ids.numel() - L - 1, (args.batch,), generator=g)
        x = torch.stack([train_ids[s:s + L] for s in starts.tolist()])
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = model(x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == args.steps - 1:
            el = time.time() - t0
            history.append((step, round(loss.item(), 4)))
            print(f"step {step:5d}  loss {loss.item():.3f}  lr {lr_at(step):.2e}  {el:6.0f}s "
                  f"({el / (step + 1):.2f} s/step)", flush=True)
        if step and step % 100 == 0:
            print(f"  held-out perplexity (32 windows): {perplexity(model, held_ids, L, 32):.2f}", flush=True)
    train_s = time.time() - t0

    model.eval()
    ppl_fp32 = perplexity(model, held_ids, L)
    print(f"final held-out perplexity (fp32, all {held_ids.numel()} held-out tokens): {ppl_fp32:.2f} "
          f"vs unigram {uni:.2f}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16)
    model.generation_config.pad_token_id = eos
    model.save_pretrained(args.out, safe_serialization=True)
    ppl_bf16_weights = perplexity(model.float(), held_ids, L)
    print(f"held-out perplexity with the saved bf16 weights (fp32 compute): {ppl_bf16_weights:.2f}", flush=True)
    tok.save_pretrained(args.out)

    # heldout.txt: the start of the held-out files, cut at a line boundary
    text = "".join(held_texts)[: args.heldout_chars]
    text = text[: text.rfind("\n") + 1]
    with open(os.path.join(args.out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    info = dict(
        python=sys.version.split()[0], torch=torch.__version__, transformers=transformers.__version__,
        train_files=[os.path.basename(f) for f in train_files], heldout_files=[os.path.basename(f) for f in held_files],
        train_tokens=train_ids.numel(), heldout_tokens=held_ids.numel(), model=MODEL, parameters=n_params,
        steps=args.steps, batch=args.batch, seq_len=args.seq_len, lr=args.lr, seed=args.seed, threads=args.threads,
        train_seconds=round(train_s, 1), total_seconds=round(time.time() - t_start, 1),
        heldout_perplexity_fp32=round(ppl_fp32, 3), heldout_perplexity_bf16_weights=round(ppl_bf16_weights, 3),
        unigram_perplexity=round(uni, 3), loss_history=history)
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"wrote {args.out} in {time.time() - t_start:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
