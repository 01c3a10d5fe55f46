"""Self-prompt (SPV-MIA's self-prompted reference, as in GUARD (anonymous preprint, 2025)): generations, fine-tune
cache, score formula.

The independent checks: the training texts are recomputed with Hugging Face ``generate`` called directly on
the released model's weights; the score is recomputed from an unpadded float64 forward of the cached
self-prompted reference and of the released model, with the formula L(x|θ_sp) − L(x|θ') written out.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch

from attacks.self_prompt import SelfPromptAttack
from bench.attacker_models import ReferenceTrainer, finetune_key, make_trainer
from bench.errors import CapabilityError
from bench.game import AttackerView, Target
from bench.lm import FINETUNE_REFERENCE, GENERATE, POPULATION, TOKEN_LOGPROBS, HFLanguageModel, RestrictedModel
from bench.metrics import roc_auc
from bench.modeling import ModelSpec, build_scratch_model, load_model
from bench.tokenizer import train_bpe_tokenizer
from bench.training import train_causal_lm
from tests.worlds import synthetic_corpus as _corpus

MAX_LEN = 64
CAPS = frozenset({TOKEN_LOGPROBS, GENERATE})
PARAMS = dict(n_prompts=24, prompt_tokens=6, generate_tokens=12, epochs=2.0, lr=2e-3, batch_size=8)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _train(model, tok, texts, epochs, seed=0):
    seqs = [([tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"])[:MAX_LEN] for t in texts]
    train_causal_lm(model, seqs, epochs=epochs, lr=3e-3, batch_size=8, seed=seed, pad_id=tok.pad_token_id,
                    progress=False)
    return model.eval()


@pytest.fixture(scope="module")
def world(tmp_path_factory, cache):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("selfprompt")
    corpus = _corpus(400, seed=3)
    train_bpe_tokenizer(corpus, root / "bpe", vocab_size=512)
    tok = AutoTokenizer.from_pretrained(str(root / "bpe"))
    spec = ModelSpec("t", num_layers=2, hidden_size=64, num_heads=4, context_length=MAX_LEN, vocab_size=512,
                     autocast_bf16=False, score_batch_size=16)
    population, members, non_members = corpus[:200], corpus[200:240], corpus[240:280]
    # attacker's reference: trained on population only; released θ': the same start, fine-tuned on the members
    reference = _train(build_scratch_model(spec, tok, seed=0), tok, population, epochs=2)
    reference.save_pretrained(root / "ref")
    tok.save_pretrained(root / "ref")
    released = _train(copy.deepcopy(reference), tok, members, epochs=12, seed=1)
    lm = HFLanguageModel(released, tok, fingerprint="released", max_length=MAX_LEN, batch_size=16)
    trainer = make_trainer(cache, spec, (root / "ref", "ref-key"), "attacker reference", torch.device("cpu"))
    texts = members + non_members
    view = AttackerView("adapt", tuple(Target(str(i), t) for i, t in enumerate(texts)),
                        RestrictedModel(lm, CAPS, "released"), None, None, tuple(population), trainer=trainer)
    labels = np.r_[np.ones(len(members)), np.zeros(len(non_members))]
    return dict(tok=tok, spec=spec, released=released, view=view, labels=labels, population=population,
                texts=texts, cache=cache, ref_dir=root / "ref")


def test_declares_what_it_needs():
    assert SelfPromptAttack.requires == {TOKEN_LOGPROBS, GENERATE, POPULATION, FINETUNE_REFERENCE}
    info = SelfPromptAttack.info()
    assert "finetune_reference" in info["requires"] and "Fu et al. 2024" in info["reference"]


def test_training_texts_are_the_released_models_own_greedy_continuations(world):
    attack = SelfPromptAttack(**PARAMS)
    got = attack.self_prompt_texts(world["view"])
    tok, model = world["tok"], world["released"]
    rng = np.random.default_rng(0)
    idx = rng.choice(len(world["population"]), size=PARAMS["n_prompts"], replace=False)
    want = []
    with torch.no_grad():
        for i in idx:
            ids = tok(world["population"][int(i)], add_special_tokens=False)["input_ids"][: PARAMS["prompt_tokens"]]
            prompt = tok.decode(ids, skip_special_tokens=True)
            inp = torch.tensor([[tok.bos_token_id] + tok(prompt, add_special_tokens=False)["input_ids"]])
            out = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), do_sample=False,
                                 max_new_tokens=PARAMS["generate_tokens"], pad_token_id=tok.pad_token_id)
            gen = tok.decode(out[0, inp.shape[1]:], skip_special_tokens=True)
            if gen.strip():
                want.append(prompt + gen)
    assert got == want and len(got) >= PARAMS["n_prompts"] // 2
    # the continuations are the released model's, not the population's: most differ from the source record
    assert sum(w not in world["population"] for w in want) >= len(want) // 2


def _nll64(model, tok, texts):
    m64 = copy.deepcopy(model).double().eval()
    out = []
    with torch.no_grad():
        for t in texts:
            ids = torch.tensor([([tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"])[:MAX_LEN]])
            logp = torch.log_softmax(m64(ids).logits[0, :-1], -1)
            out.append(-float(logp[torch.arange(ids.shape[1] - 1), ids[0, 1:]].mean()))
    return np.array(out)


def test_score_is_calibrated_likelihood_against_the_cached_self_prompted_reference(world):
    attack = SelfPromptAttack(**PARAMS)
    scores = np.asarray(attack.score(world["view"]))
    texts = attack.self_prompt_texts(world["view"])
    key = finetune_key("ref-key", texts, epochs=PARAMS["epochs"], lr=PARAMS["lr"],
                       batch_size=PARAMS["batch_size"], seed=0, spec=world["spec"])
    path = world["cache"].path("attacker_finetune", key)
    assert world["cache"].is_valid("attacker_finetune", key)
    sp_model, _ = load_model(path)
    nll_sp = _nll64(sp_model, world["tok"], world["texts"])
    nll_target = _nll64(world["released"], world["tok"], world["texts"])
    np.testing.assert_allclose(scores, nll_sp - nll_target, rtol=0, atol=1e-5)
    ratio = np.asarray(SelfPromptAttack(**PARAMS, mode="ratio").score(world["view"]))
    np.testing.assert_allclose(ratio, -nll_target / nll_sp, rtol=1e-5, atol=0)
    # fine-tuning really moved the copy away from its start (the attacker's reference) toward the generations
    ref_model, _ = load_model(world["ref_dir"])
    assert np.mean(_nll64(ref_model, world["tok"], texts)) > np.mean(_nll64(sp_model, world["tok"], texts)) + 0.05
    # members score higher: θ' was fine-tuned on them
    assert roc_auc(world["labels"], scores) > 0.8


def test_self_prompted_reference_is_cached_by_content(world):
    attack = SelfPromptAttack(**PARAMS)
    texts = attack.self_prompt_texts(world["view"])
    key = finetune_key("ref-key", texts, epochs=PARAMS["epochs"], lr=PARAMS["lr"],
                       batch_size=PARAMS["batch_size"], seed=0, spec=world["spec"])
    attack.score(world["view"])
    manifest = world["cache"].path("attacker_finetune", key) / "manifest.json"
    before = os.stat(manifest).st_mtime_ns
    SelfPromptAttack(**PARAMS).score(world["view"])          # a new instance: same content, same artifact
    assert os.stat(manifest).st_mtime_ns == before
    # any change of recipe, start model or texts is a different artifact
    other = {finetune_key("ref-key", texts, epochs=3.0, lr=PARAMS["lr"], batch_size=8, seed=0, spec=world["spec"]),
             finetune_key("other-start", texts, epochs=2.0, lr=PARAMS["lr"], batch_size=8, seed=0, spec=world["spec"]),
             finetune_key("ref-key", texts[1:], epochs=2.0, lr=PARAMS["lr"], batch_size=8, seed=0, spec=world["spec"])}
    assert key not in other and len(other) == 3


def test_missing_trainer_or_population_is_a_capability_error(world):
    v = world["view"]
    no_trainer = AttackerView("adapt", v.targets, v.model, None, None, v.population)
    with pytest.raises(CapabilityError, match="enable `reference`"):
        SelfPromptAttack(**PARAMS).score(no_trainer)
    no_pop = AttackerView("adapt", v.targets, v.model, None, None, (), trainer=v.trainer)
    with pytest.raises(CapabilityError, match="population"):
        SelfPromptAttack(**PARAMS).score(no_pop)
    assert isinstance(v.trainer, ReferenceTrainer) and v.trainer.start == "attacker reference"
    with pytest.raises(AttributeError):
        v.trainer.start = "released θ"


def test_runs_through_the_runner_on_every_start_model(cache, tmp_path):
    """Adaptation game: the attacker's reference is fine-tuned; joint game: θ (released) is."""
    from bench.runner import Runner
    from bench.store import Store
    from bench.suite import parse_suite
    from worlds import TINY

    params = dict(n_prompts=12, prompt_tokens=6, generate_tokens=12, epochs=1.0)
    raw = dict(TINY, attacks=["loss", {"name": "self_prompt", "params": params}], games=["adapt", "joint/fresh"])
    before = set(os.listdir(cache.root / "attacker_finetune")) if (cache.root / "attacker_finetune").is_dir() else set()
    store = Store(str(tmp_path / "r.db"))
    result = Runner(parse_suite(raw), store, cache, quiet=True).run()
    assert result.status == "complete" and result.new_evaluations == 4
    built = set(os.listdir(cache.root / "attacker_finetune")) - before
    assert len({b for b in built if not b.startswith(".")}) == 2     # one copy per start model (reference, θ)
    aucs = {(r["game"], r["attack"]): r["value"] for r in store.metric_rows(result.run_id) if r["metric"] == "auc"}
    assert set(aucs) == {(g, a) for g in ("adapt", "joint/fresh") for a in ("loss", "self_prompt")}
    # rerun into a fresh database: the self-prompted references come from the cache, nothing new is trained
    again = Runner(parse_suite(raw), Store(str(tmp_path / "r2.db")), cache, quiet=True).run()
    assert again.new_evaluations == 4
    assert set(os.listdir(cache.root / "attacker_finetune")) - before == built


def test_list_attacks_shows_every_attack_with_version_threat_model_and_paper():
    from typer.testing import CliRunner

    from bench.cli import app
    from bench.registry import ATTACKS

    out = CliRunner().invoke(app, ["list", "attacks"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    for name in ATTACKS.names():
        cls = ATTACKS.get(name)
        head = next((ln for ln in lines if ln.startswith(f"  {name}  ")), None)
        assert head is not None, f"{name} missing from `privbench list attacks`"
        assert f"v{cls.version}" in head and f"needs: {', '.join(sorted(cls.requires))}" in head, head
        assert cls.reference and f"paper: {cls.reference}" in out.output, name
    assert "self_prompt" in ATTACKS.names()
