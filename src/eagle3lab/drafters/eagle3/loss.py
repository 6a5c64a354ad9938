"""The training-time-test (TTT) objective: soft cross-entropy of each unrolled draft step against the target's
distribution over the draft vocabulary, weighted by step, on assistant tokens the draft vocabulary can express; with
an acceptance weight, plus that weight times the total variation between the two distributions."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eagle3lab.devices import autocast as device_autocast
from eagle3lab.models.draft import Eagle3Draft

STEP_DECAY = 0.8  # TTT step i is weighted 0.8^i (SpecForge)


def ttt_loss(
    draft: Eagle3Draft, batch: dict, head: torch.Tensor, ttt_length: int, autocast: bool, acceptance_weight: float = 0.0
) -> dict:
    """Weighted TTT loss of one batch, with per-step loss sums, correct counts and scored positions.

    Draft position t reads token t+1 and the target state at t; at step i it predicts token t+2+i, whose target
    distribution is the target's at position t+1+i restricted to the draft vocab: softmax(final @ head.T).
    A position counts only if that token is an assistant token and the target's argmax is in the draft vocab.
    `autocast` runs the draft's matmuls in bf16 on the batch's device type (CPU or CUDA). The per-step sums report
    the cross-entropy alone, so held-out losses compare across acceptance weights."""
    ids, loss_mask = batch["input_ids"], batch["loss_mask"]
    b, t = ids.shape
    with torch.no_grad():
        target_p = torch.softmax(batch["final"].float() @ head.float().T, dim=-1)  # [B, T, Vd] at target position j
        # target position j scores token j+1: it must be an assistant token the draft vocab can express
        valid = F.pad(loss_mask[:, 1:], (0, 1)) & draft.t2d[batch["argmax"]]
        target_top = target_p.argmax(-1)
    with device_autocast(ids.device, torch.bfloat16 if autocast else None):
        hidden = draft.project(batch["aux"].to(draft.fc.weight.dtype))
        inputs = F.pad(ids[:, 1:], (0, 1))
        positions = torch.arange(t, device=ids.device).expand(b, t)
        logits = draft.ttt_forward(inputs, hidden, positions, ttt_length)
    total = torch.zeros((), dtype=torch.float32, device=ids.device)
    losses, correct, counts = [], [], []
    for i, step_logits in enumerate(logits):
        shift = 1 + i
        p = F.pad(target_p[:, shift:], (0, 0, 0, shift))
        m = F.pad(valid[:, shift:], (0, shift))
        n = m.sum()
        log_q = torch.log_softmax(step_logits.float(), dim=-1)
        ce = -(p * log_q).sum(-1)
        loss_sum = (ce * m).sum()
        objective = loss_sum
        if acceptance_weight:
            rejected = 1 - torch.minimum(p, log_q.exp()).sum(-1)  # 1 - the acceptance rate of sampling from q
            objective = objective + acceptance_weight * (rejected * m).sum()
        total = total + STEP_DECAY**i * objective / n.clamp(min=1)
        losses.append(loss_sum.detach())
        correct.append(((step_logits.argmax(-1) == F.pad(target_top[:, shift:], (0, shift))) & m).sum())
        counts.append(n)
    return {
        "loss": total,
        "loss_sum": torch.stack(losses),
        "correct": torch.stack(correct),
        "count": torch.stack(counts),
    }


class TTTObjective(torch.nn.Module):
    """The draft plus its loss as one module: DDP must wrap the module whose forward runs."""

    def __init__(self, draft: Eagle3Draft):
        super().__init__()
        self.draft = draft

    def forward(self, batch, head, ttt_length, autocast, acceptance_weight=0.0):
        return ttt_loss(self.draft, batch, head, ttt_length, autocast, acceptance_weight)


def summarize(sums: torch.Tensor, correct: torch.Tensor, counts: torch.Tensor) -> dict:
    """Per-step mean loss and accuracy from summed statistics (of one batch, one rank or all of them)."""
    sums, correct, counts = sums.float().cpu(), correct.float().cpu(), counts.float().cpu()
    c = counts.clamp(min=1)
    loss_pos = (sums / c).tolist()
    return {
        "loss": sum(STEP_DECAY**i * x for i, x in enumerate(loss_pos)),
        "loss_pos": [round(x, 5) for x in loss_pos],
        "acc_pos": [round(x, 5) for x in (correct / c).tolist()],
        "positions": [int(x) for x in counts.tolist()],
    }
