"""Medusa heads: K residual-block heads on the target's last (normed) hidden state.

    heads = MedusaHeads.from_target(target, num_heads=4, num_layers=1, vocab=draft_vocab, target_name="smollm2-135m-instruct")
    logits = heads(hidden)                  # hidden [..., h] -> draft logits [K, ..., V']
    target_ids = heads.to_target_ids(logits.argmax(-1))
    heads.save_pretrained("runs/x/medusa")   # config.json + model.safetensors
    heads = MedusaHeads.from_pretrained("runs/x/medusa", target=target)   # checks hidden size and vocab

Head k (k = 1..K) at position t predicts token t+k+1 (head 1: the token after the target's own next token).
Parameter names are vLLM's Medusa loader's (`blocks.{i}.layers.{j}.weight/.bias`, `lm_heads.{i}.weight`,
`token_map` when the vocabulary is reduced) and config.json carries vLLM's MedusaConfig keys, so the
checkpoint folder is what vLLM loads. The residual blocks start as identity (zero weights) and each
lm_head starts as the target's lm_head rows of the draft vocabulary, so an untrained head 1 predicts like
the target would one token early.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from headway.heads.base import CONFIG_FILE, WEIGHTS_FILE, checkpoint_files
from headway.heads.vocab import DraftVocab


@dataclass
class MedusaHeadsConfig:
    num_heads: int
    num_layers: int  # residual blocks per head
    hidden_size: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int | None = None  # None or == vocab_size: full vocabulary
    fc_bias: bool = True  # the original Medusa's blocks have a bias
    target: dict = field(default_factory=dict)  # name, hidden_size, vocab_size (+ fingerprint)

    @property
    def reduced(self) -> bool:
        return self.draft_vocab_size is not None and self.draft_vocab_size < self.vocab_size

    @property
    def out_size(self) -> int:
        return self.draft_vocab_size if self.reduced else self.vocab_size

    def to_json(self) -> dict:
        """vLLM's MedusaConfig keys first, headway's own after (vLLM ignores unknown keys)."""
        return {
            "model_type": "medusa",
            "architectures": ["MedusaModel"],
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "num_heads": self.num_heads,
            "num_hidden_layers": self.num_layers,
            "truncated_vocab_size": self.out_size,
            "medusa_fc_bias": self.fc_bias,
            "headway": {"format": "medusa-heads", "version": 1, **asdict(self)},
        }

    @classmethod
    def from_json(cls, data: dict, where: str) -> MedusaHeadsConfig:
        own = data.get("headway")
        if not isinstance(own, dict) or own.get("format") != "medusa-heads":
            raise ValueError(f"{where}: not a headway Medusa heads config (no 'headway.format: medusa-heads')")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in own.items() if k in known})


class ResidualBlock(nn.Module):
    """x + SiLU(Linear(x)), repeated; vLLM names the linears `layers.{j}`."""

    def __init__(self, hidden_size: int, num_layers: int, bias: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden_size, hidden_size, bias=bias) for _ in range(num_layers))
        self.act = nn.SiLU()
        for layer in self.layers:  # identity at start: SiLU(0) = 0
            nn.init.zeros_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + self.act(layer(x))
        return x


class MedusaHeads(nn.Module):
    def __init__(self, config: MedusaHeadsConfig, token_map: torch.Tensor | None = None) -> None:
        super().__init__()
        if config.num_heads < 1 or config.num_layers < 0:
            raise ValueError(f"need num_heads >= 1 and num_layers >= 0, got {config.num_heads}, {config.num_layers}")
        self.config = config
        h = config.hidden_size
        self.blocks = nn.ModuleList(ResidualBlock(h, config.num_layers, config.fc_bias) for _ in range(config.num_heads))
        self.lm_heads = nn.ModuleList(nn.Linear(h, config.out_size, bias=False) for _ in range(config.num_heads))
        if config.reduced:
            if token_map is None:
                token_map = torch.arange(config.out_size, dtype=torch.int64)  # placeholder until loaded
            vocab = DraftVocab(token_map.to(torch.int64).cpu(), config.vocab_size)
            if vocab.size != config.out_size:
                raise ValueError(f"token_map has {vocab.size} entries, config says draft_vocab_size={config.out_size}")
            self.register_buffer("token_map", vocab.token_map.clone())
            # Not saved: derived from token_map (target id -> draft id, -1 outside).
            self.register_buffer("target_to_draft", vocab.target_to_draft_table(), persistent=False)
        else:
            self.token_map = None
            self.target_to_draft = None

    # ------------------------------------------------------------ construction

    @classmethod
    def from_target(
        cls,
        target: nn.Module,
        num_heads: int,
        num_layers: int = 1,
        vocab: DraftVocab | None = None,
        target_name: str = "",
        fc_bias: bool = True,
        fingerprint: dict | None = None,
    ) -> MedusaHeads:
        """Fresh heads (fp32) whose lm_heads copy the target's lm_head rows of the draft vocabulary."""
        c = target.config
        lm_head = target.get_output_embeddings().weight
        if vocab is not None and vocab.target_vocab_size != lm_head.shape[0]:
            raise ValueError(
                f"draft vocabulary built for a vocabulary of {vocab.target_vocab_size}, the target's lm_head has {lm_head.shape[0]}"
            )
        reduced = vocab is not None and vocab.size < lm_head.shape[0]
        config = MedusaHeadsConfig(
            num_heads=num_heads,
            num_layers=num_layers,
            hidden_size=c.hidden_size,
            vocab_size=lm_head.shape[0],
            draft_vocab_size=vocab.size if reduced else None,
            fc_bias=fc_bias,
            target={
                "name": target_name,
                "hidden_size": c.hidden_size,
                "vocab_size": lm_head.shape[0],
                **({"fingerprint": fingerprint} if fingerprint else {}),
            },
        )
        heads = cls(config, vocab.token_map if reduced else None)
        rows = lm_head.detach()[vocab.token_map.to(lm_head.device)] if reduced else lm_head.detach()
        with torch.no_grad():
            for head in heads.lm_heads:
                head.weight.copy_(rows.float().cpu())
        return heads.to(lm_head.device)

    # ------------------------------------------------------------ forward

    def head_logits(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of head k (0-based here; head index k+1 in the paper's numbering): [..., h] -> [..., V']."""
        return self.lm_heads[k](self.blocks[k](hidden))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., h] (the target's last hidden state after its final norm) -> draft logits [K, ..., V']."""
        if hidden.shape[-1] != self.config.hidden_size:
            raise ValueError(f"hidden states of size {hidden.shape[-1]}, the heads expect {self.config.hidden_size}")
        hidden = hidden.to(self.lm_heads[0].weight.dtype)
        return torch.stack([self.head_logits(k, hidden) for k in range(self.config.num_heads)])

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (the identity for a full vocabulary)."""
        return draft_ids if self.token_map is None else self.token_map[draft_ids]

    def to_draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft ids, -1 where the token is outside the draft vocabulary."""
        return target_ids if self.target_to_draft is None else self.target_to_draft[target_ids]

    @property
    def draft_vocab(self) -> DraftVocab:
        if self.token_map is None:
            return DraftVocab.full(self.config.vocab_size)
        return DraftVocab(self.token_map.cpu(), self.config.vocab_size)

    # ------------------------------------------------------------ save / load

    def save_pretrained(self, folder: str | Path) -> Path:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        (folder / CONFIG_FILE).write_text(json.dumps(self.config.to_json(), indent=2) + "\n")
        return folder

    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path,
        target: nn.Module | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> MedusaHeads:
        """Load heads; with `target`, check they were trained for its hidden size and vocabulary."""
        from safetensors.torch import load_file

        cfg_path, w_path = checkpoint_files(folder, "Medusa heads")
        config = MedusaHeadsConfig.from_json(json.loads(cfg_path.read_text()), str(cfg_path))
        if target is not None:
            check_target_matches(config, target, str(folder))
        state = load_file(str(w_path))
        heads = cls(config, state.get("token_map"))
        missing, unexpected = heads.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{w_path}: missing weights {missing}, unexpected weights {unexpected}")
        if device is None and target is not None:
            device = target.get_output_embeddings().weight.device
        heads.to(device=device)
        if dtype is not None:
            heads.to(dtype=dtype)  # floating parameters only; the int64 maps stay as they are
        return heads.eval()


def check_target_matches(config: MedusaHeadsConfig, target: nn.Module, where: str) -> None:
    """Heads trained for one target must not be loaded onto another shape: name both values."""
    have_hidden = target.config.hidden_size
    have_vocab = target.get_output_embeddings().weight.shape[0]
    if config.hidden_size != have_hidden:
        raise ValueError(
            f"{where}: heads were trained for hidden_size={config.hidden_size} "
            f"(target {config.target.get('name', '?')!r}), this target has hidden_size={have_hidden}"
        )
    if config.vocab_size != have_vocab:
        raise ValueError(
            f"{where}: heads were trained for vocab_size={config.vocab_size} "
            f"(target {config.target.get('name', '?')!r}), this target has vocab_size={have_vocab}"
        )
