"""Self-distillation: loss mask, batched generation, resume after interruption, skips, refusals."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from headway.config import Config, DataConfig, GenerationConfig, SourceConfig
from headway.data.answering import ConversationJob
from headway.data.chat import first_turn_ids
from headway.data.dataset import collate, load_distilled
from headway.data.distill import OutputMismatchError, distill
from headway.data.generate import generate_batch
from headway.data.sources import load_conversations, row_turns


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(tmp_path, src, **gen) -> Config:
    g = dict(max_new_tokens=12, batch_size=3, shard_size=2, max_prompt_tokens=200, max_turns=2)
    g.update(gen)
    return Config(
        data=DataConfig(
            output_dir=str(tmp_path / "out"),
            sources=[SourceConfig(path=str(src), domain="chat")],
            generation=GenerationConfig(**g),
            val_fraction=0.3,
        )
    )


PROMPTS = [
    {"turns": ["Name a colour.", "And another one?"]},
    {"turns": ["What is 2+2?"]},
    {"turns": ["Write a haiku about rain.", "Now one about snow."]},
    {"turns": ["Say hi."]},
    {"turns": ["List three fruits."]},
]


class _ScriptedDecoder(torch.nn.Module):
    """Its 'hidden state' is the position: the scripted head reads the next token off it."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList()

    def forward(self, input_ids, position_ids, **_):
        return SimpleNamespace(last_hidden_state=position_ids[..., None].float())


class _ScriptedHead(torch.nn.Module):
    def __init__(self, vocab, eos):
        super().__init__()
        self.vocab, self.eos = vocab, eos

    def forward(self, hidden):
        nxt = hidden[..., 0].long() + 1
        tok = torch.where(nxt % 5 == 0, torch.full_like(nxt, self.eos), 1000 + nxt % 7)
        return torch.nn.functional.one_hot(tok, self.vocab).float()


class ScriptedModel(torch.nn.Module):
    """Emits token 1000 + position % 7, and EOS at every position divisible by 5: answers of known shape."""

    def __init__(self, vocab=49152, eos=2):
        super().__init__()
        self.config = SimpleNamespace(max_position_embeddings=4096)
        self.generation_config = SimpleNamespace(eos_token_id=eos)
        self.dummy = torch.nn.Parameter(torch.zeros(1), requires_grad=False)
        self.decoder, self.head = _ScriptedDecoder(), _ScriptedHead(vocab, eos)

    @property
    def dtype(self):
        return torch.float32

    def get_decoder(self):
        return self.decoder

    def get_output_embeddings(self):
        return self.head


def test_loss_mask_covers_exactly_the_generated_tokens(tmp_path, smol_tok):
    src = _write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    cfg = _cfg(tmp_path, src, max_new_tokens=9)
    model = ScriptedModel()
    summary = distill(cfg, model=model, tok=smol_tok, log=lambda *_: None, fingerprint={"name": "scripted"})
    ds = load_distilled(cfg.data.output_dir)
    rows = list(ds["train"]) + list(ds["validation"])
    assert len(rows) == len(PROMPTS) == summary["examples"]
    for row in rows:
        ids, mask = row["input_ids"], row["loss_mask"]
        assert len(ids) == len(mask)
        turns = next(p["turns"] for i, p in enumerate(PROMPTS) if row["prompt_id"].endswith(f":{i}"))
        assert row["num_turns"] == len(turns)
        # Masked runs are exactly the scripted answers: 1000 + pos % 7 tokens, ended by EOS at pos % 5 == 0.
        runs, cur = [], []
        for pos, (t, m) in enumerate(zip(ids, mask, strict=True)):
            if m:
                assert t == (2 if pos % 5 == 0 else 1000 + pos % 7)
                cur.append(t)
            elif cur:
                runs.append(cur)
                cur = []
        runs += [cur] if cur else []
        assert len(runs) == len(turns)
        assert all(r[-1] == 2 for r in runs), "each answer ends with the EOS the target produced"
        # Unmasked tokens are exactly the chat template around those answers.
        messages = []
        for user, run in zip(turns, runs, strict=True):
            messages += [
                {"role": "user", "content": user},
                {"role": "assistant", "content": smol_tok.decode(run[:-1])},
            ]
        rendered = smol_tok.apply_chat_template(messages, tokenize=False)
        assert smol_tok.decode(ids) == rendered.rstrip("\n")


def test_loss_mask_on_real_target(tmp_path, smol_tok, smol_fp32):
    src = _write_jsonl(tmp_path / "p.jsonl", PROMPTS[:2])
    cfg = _cfg(tmp_path, src, max_new_tokens=10)
    distill(cfg, model=smol_fp32, tok=smol_tok, log=lambda *_: None)
    ds = load_distilled(cfg.data.output_dir)
    row = next(r for r in list(ds["train"]) + list(ds["validation"]) if r["prompt_id"].endswith(":0"))
    ids, mask = row["input_ids"], row["loss_mask"]
    first = first_turn_ids(smol_tok, PROMPTS[0]["turns"][0])
    assert ids[: len(first)] == first and not any(mask[: len(first)])
    answer1 = ids[len(first) : len(first) + 10]
    assert mask[len(first) : len(first) + len(answer1)] == [1] * len(answer1)
    # Plain greedy decoding of the first turn gives the same answer tokens.
    ref = smol_fp32.generate(torch.tensor([first]), max_new_tokens=10, do_sample=False)[0, len(first) :].tolist()
    assert answer1[: len(ref)] == ref
    assert row["num_turns"] == 2 and sum(mask) > len(answer1)
    # The second user turn is template (mask 0) text.
    unmasked = smol_tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "And another one?" in unmasked and "And another one?" not in smol_tok.decode(
        [t for t, m in zip(ids, mask, strict=True) if m]
    )


def test_batched_generation_equals_one_at_a_time(tiny_smol_vocab, smol_tok):
    prompts = [first_turn_ids(smol_tok, p["turns"][0]) for p in PROMPTS]
    eos = {smol_tok.eos_token_id}
    batched = generate_batch(tiny_smol_vocab, prompts, 16, eos, smol_tok.pad_token_id)
    for p, ans in zip(prompts, batched, strict=True):
        alone = generate_batch(tiny_smol_vocab, [p], 16, eos, smol_tok.pad_token_id)[0]
        assert ans.tokens == alone.tokens
    # and both equal transformers' own greedy generate
    ref = tiny_smol_vocab.generate(torch.tensor([prompts[1]]), max_new_tokens=16, do_sample=False)
    assert ref[0, len(prompts[1]) :].tolist() == batched[1].tokens


def test_rows_leave_the_batch_at_eos(smol_tok):
    model = ScriptedModel()
    prompts = [list(range(10, 10 + n)) for n in (3, 6, 8)]
    out = generate_batch(model, prompts, 20, {2}, smol_tok.pad_token_id)
    for p, a in zip(prompts, out, strict=True):
        assert a.finished and a.tokens[-1] == 2 and 2 not in a.tokens[:-1]
        assert (len(p) - 1 + len(a.tokens)) % 5 == 0  # stopped at the first EOS position


def test_sampling_is_seeded(tiny_smol_vocab, smol_tok):
    prompts = [first_turn_ids(smol_tok, "Hello")]
    a = generate_batch(tiny_smol_vocab, prompts, 8, {2}, 2, temperature=1.0, top_p=0.9, seed=3)
    b = generate_batch(tiny_smol_vocab, prompts, 8, {2}, 2, temperature=1.0, top_p=0.9, seed=3)
    c = generate_batch(tiny_smol_vocab, prompts, 8, {2}, 2, temperature=1.0, top_p=0.9, seed=4)
    assert a[0].tokens == b[0].tokens and a[0].tokens != c[0].tokens


def _all_rows(out_dir):
    ds = load_distilled(out_dir)
    return sorted((r["prompt_id"], tuple(r["input_ids"]), tuple(r["loss_mask"])) for s in ds.values() for r in s)


def test_resume_after_interruption(tmp_path, tiny_smol_vocab, smol_tok, monkeypatch):
    src = _write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    quiet = dict(log=lambda *_: None)
    # batch_size 1: one conversation at a time, so the run can die inside a shard.
    ref_cfg = _cfg(tmp_path / "ref", src, batch_size=1)
    distill(ref_cfg, model=tiny_smol_vocab, tok=smol_tok, **quiet)

    cfg = _cfg(tmp_path, src, batch_size=1)
    import headway.data.distill as distill_module

    monkeypatch.setattr(distill_module, "answer_order", lambda n, seed: list(range(n)))  # shards in file order
    # Interrupt between shards: shard 0 is written, then the run dies.
    def stop(k):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        distill(cfg, model=tiny_smol_vocab, tok=smol_tok, after_shard=stop, **quiet)
    shards = tmp_path / "out" / "shards"
    assert sorted(p.name for p in shards.glob("*.json")) == ["shard-00000.json"]
    first_mtime = (shards / "shard-00000.json").stat().st_mtime_ns

    # Interrupt in the middle of shard 1 (its second answer): nothing of it may be kept.
    real = ConversationJob.answered
    calls = {"n": 0}

    def dies_on_second_call(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(ConversationJob, "answered", dies_on_second_call)
    with pytest.raises(KeyboardInterrupt):
        distill(cfg, model=tiny_smol_vocab, tok=smol_tok, **quiet)
    monkeypatch.setattr(ConversationJob, "answered", real)
    assert sorted(p.name for p in shards.glob("*.json")) == ["shard-00000.json"]

    done = []
    distill(cfg, model=tiny_smol_vocab, tok=smol_tok, after_shard=done.append, **quiet)
    assert done == [1, 2], "finished shards are not generated again"
    assert (shards / "shard-00000.json").stat().st_mtime_ns == first_mtime
    rows = _all_rows(cfg.data.output_dir)
    assert len({r[0] for r in rows}) == len(rows) == len(PROMPTS), "no row lost or duplicated"
    assert rows == _all_rows(ref_cfg.data.output_dir), "same rows as an uninterrupted run"


def test_a_kept_first_answer_is_fed_not_generated_again(tiny_smol_vocab, smol_tok):
    """A conversation that carries the target's own first answer (Magpie's follow-up writer kept it) gives
    the row and features of one answered from scratch, and the generator answers only its second turn."""
    from headway.data.answering import ShardWork, TurnSettings
    from headway.data.generate import Generator
    from headway.data.sources import Conversation
    from headway.features import FeatureSpec

    turns = ["Name three colours.", "Now three animals."]
    settings = TurnSettings(max_new_tokens=10, max_context=4096, seed=0)
    spec = FeatureSpec(layers=(0,), final_normed=True)

    def run(first_answer):
        shard, generated = ShardWork(0, 1, lambda s: None), []
        job = ConversationJob(Conversation("c:0", "c", "chat", turns, first_answer), first_turn_ids(smol_tok, turns[0]), smol_tok, settings, shard, 0)
        Generator(tiny_smol_vocab, 2, 10, {2}, capture=spec, on_answer=generated.append).run([job])
        return shard, generated

    scratch, generated = run(None)
    assert len(generated) == 2 and scratch.rows[0]["num_turns"] == 2
    fed, generated_fed = run({"tokens": generated[0].tokens, "finished": generated[0].finished})
    assert generated_fed == generated[1:], "only the second turn is generated"
    assert fed.rows == scratch.rows, "same ids, loss mask, turns"
    assert fed.gen_tokens == len(generated[1].tokens), "the fed answer is not counted as generated in this run"
    for key, t in scratch.features[0].items():  # fp32: a prefill over the fed answer equals its decode steps
        scale = max(1.0, float(t.abs().max()))
        assert (fed.features[0][key] - t).abs().max() <= 1e-4 * scale, key


def test_overlong_prompts_are_skipped_and_counted(tmp_path, tiny_smol_vocab, smol_tok):
    long_prompt = {"turns": ["word " * 400]}
    src = _write_jsonl(tmp_path / "p.jsonl", PROMPTS[:3] + [long_prompt])
    cfg = _cfg(tmp_path, src, max_prompt_tokens=120)
    summary = distill(cfg, model=tiny_smol_vocab, tok=smol_tok, log=lambda *_: None)
    assert summary["examples"] == 3
    assert summary["skipped"] == {"prompt longer than max_prompt_tokens=120": 1}
    assert all(len(r[1]) < 400 for r in _all_rows(cfg.data.output_dir))


def test_output_dir_with_other_settings_is_refused(tmp_path, tiny_smol_vocab, smol_tok):
    src = _write_jsonl(tmp_path / "p.jsonl", PROMPTS[:2])
    cfg = _cfg(tmp_path, src)
    distill(cfg, model=tiny_smol_vocab, tok=smol_tok, log=lambda *_: None)
    before = sorted(p.name for p in (tmp_path / "out").rglob("*"))
    cfg.data.generation.max_new_tokens = 64
    with pytest.raises(OutputMismatchError, match="generation.max_new_tokens: was 12, now 64"):
        distill(cfg, model=tiny_smol_vocab, tok=smol_tok, log=lambda *_: None)
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == before, "nothing written is lost"
    # A different target (another random init) is refused too.
    from tiny_models import tiny_llama

    cfg.data.generation.max_new_tokens = 12
    other = tiny_llama(vocab_size=49152, hidden_size=64, num_layers=2, seed=1)
    with pytest.raises(OutputMismatchError, match="target.embedding_probe"):
        distill(cfg, model=other, tok=smol_tok, log=lambda *_: None)


def test_source_errors_name_the_file(tmp_path):
    missing = DataConfig(sources=[SourceConfig(path=str(tmp_path / "nope.jsonl"), domain="chat")])
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_conversations(missing)
    empty = _write_jsonl(tmp_path / "empty.jsonl", [{"foo": 1}])
    with pytest.raises(ValueError, match="empty.jsonl has no usable prompts"):
        load_conversations(DataConfig(sources=[SourceConfig(path=str(empty), domain="chat")]))


def test_row_formats():
    assert row_turns({"turns": ["a", "b"]}, "auto") == ["a", "b"]
    sharegpt = {"conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "x"}, {"from": "human", "value": "q2"}]}
    assert row_turns(sharegpt, "auto") == ["q1", "q2"]
    assert row_turns({"conversations": [{"from": "gpt", "value": "x"}]}, "auto") == []
    assert row_turns({"instruction": "Fix it.", "input": "code"}, "auto") == ["Fix it.\n\ncode"]
    assert row_turns({"instruction": "Rewrite.", "instances": [{"input": "text", "output": "o"}]}, "auto") == ["Rewrite.\n\ntext"]
    assert row_turns({"question": "2+2?", "answer": "4"}, "auto") == ["2+2?"]


def test_default_mix_sources_parse():
    from headway.config import load_config

    cfg = load_config("configs/smollm2-135m/data.yaml")
    convs, skipped = load_conversations(cfg.data)  # no target: the self_written sources are skipped, and counted
    domains = {c.domain for c in convs}
    assert domains == {"math", "code", "general", "translation", "summarization", "rag"}
    assert len({c.prompt_id for c in convs}) == len(convs)
    self_written = [s for s in cfg.data.sources if s.kind == "self_written"]
    assert sum(v for k, v in skipped.items() if "no target" in k) == len(self_written)


def test_collate_pads_right():
    rows = [{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, {"input_ids": [8], "loss_mask": [1]}]
    b = collate(rows, pad_id=0)
    assert b["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert b["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]


def test_two_cpu_processes_split_the_shards(tmp_path, tiny_smol_vocab, smol_tok):
    """`accelerate launch --num_processes 2` on CPU: each process generates its own shards."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    target = tmp_path / "tiny"
    tiny_smol_vocab.save_pretrained(target)
    smol_tok.save_pretrained(target)
    src = _write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2",
        "--config_file", str(root / "configs/accelerate/cpu.yaml"), "--main_process_port", "29533",
        str(root / "scripts/generate_data.py"), "--config", str(root / "configs/smollm2-135m/data.yaml"),
        f"target.name={target}", "target.hidden_size=null", "target.num_hidden_layers=null", "target.vocab_size=null",
        f"data.output_dir={out}", f"data.sources=[{{path: {src}, domain: chat}}]",
        "data.generation.max_new_tokens=6", "data.generation.shard_size=1", "data.features=[]",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    made_by = {json.loads(p.read_text())["stats"]["process"] for p in (out / "shards").glob("*.json")}
    assert made_by == {0, 1}
    assert len(_all_rows(out)) == len(PROMPTS)


def test_stop_token_ids_unite_generation_config_and_tokenizer():
    from headway.target import stop_token_ids

    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[128001, 128009]))
    assert stop_token_ids(model, SimpleNamespace(eos_token_id=128009)) == {128001, 128009}
    assert stop_token_ids(SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=2))) == {2}
    no_config = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None))
    assert stop_token_ids(no_config, SimpleNamespace(eos_token_id=0)) == {0}
    assert stop_token_ids(SimpleNamespace()) == set()
