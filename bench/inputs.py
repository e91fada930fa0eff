"""Benchmark inputs, all deterministic and cached in bench/out: the local HF tokenizer and the synth logs.

Sizes per scale (the issue's sizes at `full`, about 10x smaller at `small`):

| input | small | full |
|---|---|---|
| chat log (rows 1, 2, 6) | 10,000 requests | 100,000 requests |
| Mooncake trace (rows 3, 4, 5) | 100,000 requests | 1,000,000 requests |
| row 7 trace | 1,000,000 requests | 10,000,000 requests |
| row 7 chat log | ~500 MB | >= 5 GB |
"""

from __future__ import annotations

from pathlib import Path

from common import OUT, cached, run, synth

SEED = 20261129
CHAT_PROMPT_TOKENS = 26000  # synth sizes text at 4 chars/token; this BPE averages ~6.6, so prompts average ~8k

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SIZES = {
    "small": {"chat": 10_000, "trace": 100_000, "trace7": 1_000_000, "chat7_bytes": 500_000_000},
    "full": {"chat": 100_000, "trace": 1_000_000, "trace7": 10_000_000, "chat7_bytes": 5_200_000_000},
}


def tokenizer_dir(log: Path | None = None) -> Path:
    """A byte-level BPE (vocab up to 32k) trained on synth text, with a ChatML template, saved like a model."""
    path = OUT / "tokenizer"

    def make(p: Path) -> None:
        sample = synth(OUT / "tok-train.jsonl", requests=3000, seed=SEED + 1, scenario="all", log=log)
        run([str(Path(__file__).parent.parent / ".venv/bin/python"), str(Path(__file__).parent / "inputs.py"),
             "build-tokenizer", str(sample), str(p)], log=log)

    return cached(path, {"vocab": 32000, "template": CHATML, "train_seed": SEED + 1}, make)


def _build_tokenizer(sample: Path, out: Path) -> None:
    import orjson
    import tokenizers
    import transformers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    def corpus():
        with open(sample, "rb") as f:
            for line in f:
                o = orjson.loads(line)
                for m in o.get("messages") or []:
                    c = m.get("content")
                    if isinstance(c, str):
                        yield c
                if o.get("tools"):
                    yield orjson.dumps(o["tools"]).decode()

    t = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=32000, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t.train_from_iterator(corpus(), trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>",
                                                additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = CHATML
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)


def chat_log(scale: str, log: Path | None = None) -> Path:
    n = SIZES[scale]["chat"]
    return synth(OUT / f"chat-{scale}.jsonl", requests=n, seed=SEED, scenario="chat",
                 extra=["--prompt-tokens", str(CHAT_PROMPT_TOKENS), "--rps", "50"], log=log)


def trace(n: int, log: Path | None = None) -> Path:
    """A Mooncake-format hashed trace (512-token blocks) from the mixed scenarios."""
    return synth(OUT / f"trace-{n}.jsonl", requests=n, seed=SEED, fmt="mooncake", scenario="all",
                 extra=["--rps", "200", "--prompt-tokens", "8000"], log=log)


def big_chat(target_bytes: int, tag: str, log: Path | None = None) -> Path:
    """A chat JSONL of at least `target_bytes` (request count from the size per request of the row-1 mix)."""
    per_req = 52_000  # bytes per request of the chat scenario at CHAT_PROMPT_TOKENS (measured)
    n = int(target_bytes / per_req * 1.05) + 1
    return synth(OUT / f"bigchat-{tag}.jsonl", requests=n, seed=SEED + 7, scenario="chat",
                 extra=["--prompt-tokens", str(CHAT_PROMPT_TOKENS), "--rps", "50"], log=log)


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "build-tokenizer":
        _build_tokenizer(Path(sys.argv[2]), Path(sys.argv[3]))
