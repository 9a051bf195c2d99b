"""Soft-label cross-entropy through an output projection, without keeping [positions, vocab] tensors for backward.

    loss_sum, pred = projected_soft_ce(hidden, weight, probs, rows)
    # hidden [n, d] -> logits hidden @ weight.T [n, V]; rows [n]: row of `probs` [N, V] each position learns
    # (-1: none, only its prediction is wanted); loss_sum = sum of CE(probs[rows], logits); pred [n] = argmax

Autograd would keep each call's logits and their fp32 log-softmax until backward: on the SmolLM2 EAGLE-3
recipe (8 x 1,024 tokens, 8,192-token draft head) 0.43 GB per unrolled step, 3 GB for seven. Here the
gradient with respect to the logits, softmax(z) * sum(p) - p, is formed chunk by chunk in the forward
pass and folded at once into the gradients of `hidden` and `weight`: what stays for backward is [n, d] +
[V, d], the transient is one chunk's logits, and the matmuls are those autograd would have run (in the
ambient autocast dtype). Without gradients (validation) only the loss and predictions are computed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 2048  # positions per chunk: the transient is CHUNK x V logits in fp32, a few times over


def _chunks(hidden, weight, probs, rows, chunk, with_grads):
    """Loss sum, predictions and (with_grads) d loss / d hidden, d loss / d weight, chunk by chunk."""
    n = hidden.shape[0]
    loss = hidden.new_zeros((), dtype=torch.float32)
    pred = torch.empty(n, dtype=torch.long, device=hidden.device)
    grad_h = torch.empty_like(hidden) if with_grads else None
    grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if with_grads else None
    for s in range(0, n, chunk):
        h, r = hidden[s : s + chunk], rows[s : s + chunk]
        z = F.linear(h, weight)  # in the autocast dtype when autocast is on, as the plain loss would be
        pred[s : s + chunk] = z.argmax(-1)
        keep = r >= 0
        target = torch.zeros(z.shape, dtype=torch.float32, device=z.device)
        target[keep] = probs[r[keep]].float()
        logp = torch.log_softmax(z.float(), dim=-1)
        loss = loss - (target * logp).sum()
        if with_grads:
            g = logp.exp_().mul_(target.sum(-1, keepdim=True)).sub_(target).to(z.dtype)  # d CE / d z
            grad_h[s : s + chunk] = (g @ weight.to(z.dtype)).to(hidden.dtype)
            grad_w += (g.T @ h.to(z.dtype)).float()
    return loss, pred, grad_h, grad_w


class _ProjectedSoftCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, probs, rows, chunk):
        loss, pred, grad_h, grad_w = _chunks(hidden, weight, probs, rows, chunk, with_grads=True)
        ctx.grads = grad_h, grad_w.to(weight.dtype)  # all backward needs: the gradients, already formed
        ctx.mark_non_differentiable(pred)
        return loss, pred

    @staticmethod
    def backward(ctx, grad_loss, _grad_pred):
        grad_h, grad_w = ctx.grads
        del ctx.grads  # the graph outlives backward while the loss tensor does: do not keep these with it
        return grad_h * grad_loss.to(grad_h.dtype), grad_w * grad_loss.to(grad_w.dtype), None, None, None


def projected_soft_ce(
    hidden: torch.Tensor, weight: torch.Tensor, probs: torch.Tensor, rows: torch.Tensor, chunk: int = CHUNK
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over positions with rows >= 0 of CE(probs[rows], hidden @ weight.T), argmax over the vocabulary)."""
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _ProjectedSoftCE.apply(hidden, weight, probs, rows, chunk)
    loss, pred, _, _ = _chunks(hidden, weight, probs, rows, chunk, with_grads=False)
    return loss, pred
