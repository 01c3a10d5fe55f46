"""A tiny training world shared by the defense tests: word texts, a 512-token BPE, a 2-layer model spec."""

from __future__ import annotations

import random

import torch

from bench.defense import TrainContext
from bench.modeling import ModelSpec, build_scratch_model
from bench.tokenizer import train_bpe_tokenizer

WORDS = ("alpha beta gamma delta river stone cloud market doctor patient record street garden window "
         "letter number seven eleven blue green quiet rapid north south paper table").split()


def word_texts(n: int, seed: int, lo: int = 6, hi: int = 14) -> list[str]:
    """``n`` seeded sentences of ``lo``–``hi`` words from :data:`WORDS`."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) + "." for _ in range(n)]


def tiny_world(tmp_dir) -> dict:
    """Tokenizer, model spec and training context of a 64-token, 2-layer GPT-NeoX (built in seconds)."""
    from transformers import AutoTokenizer
    train_bpe_tokenizer(word_texts(200, 0), tmp_dir, vocab_size=512)
    tok = AutoTokenizer.from_pretrained(str(tmp_dir))
    spec = ModelSpec("t", num_layers=2, hidden_size=64, num_heads=4, context_length=64)
    ctx = TrainContext(tok, torch.device("cpu"), 64, seed=0, autocast_bf16=False, progress=False)
    return {"tok": tok, "spec": spec, "ctx": ctx}


def tiny_model(world: dict, seed: int = 0):
    return build_scratch_model(world["spec"], world["tok"], seed)


def tiny_trainable(world: dict, method: str):
    """The tiny model with what ``method`` trains requiring grad: every weight (full), the output head only (head),
    or LoRA adapters (r = 4) whose B is non-zero, so that A's gradient is not trivially 0 (lora)."""
    model = tiny_model(world)
    if method == "head":
        for p in model.parameters():
            p.requires_grad_(False)
        model.get_output_embeddings().weight.requires_grad_(True)
    elif method == "lora":
        from peft import LoraConfig, get_peft_model

        from defenses.dp import LORA_TARGETS
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS,
                                                 task_type="CAUSAL_LM"))
        torch.manual_seed(5)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.1)
    return model


def one_thread():
    """Generator for an autouse fixture: the models are tiny, one intra-op thread is fastest."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
