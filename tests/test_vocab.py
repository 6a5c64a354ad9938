"""Draft vocabulary: most frequent loss-bearing tokens, padding, d2t/t2d maps, coverage."""

import pytest
import torch

from eagle3lab.models.vocab import build_vocab, count_tokens, fixed_vocab


def test_counts_only_loss_positions():
    ids = torch.tensor([5, 5, 7, 7, 7, 9])
    mask = torch.tensor([False, True, True, True, False, True])
    counts = count_tokens([(ids, mask), (torch.tensor([9]), torch.tensor([True]))], vocab_size=12)
    assert counts.tolist() == [0, 0, 0, 0, 0, 1, 0, 2, 0, 2, 0, 0]
    with pytest.raises(ValueError, match="outside"):
        count_tokens([(torch.tensor([12]), torch.tensor([True]))], vocab_size=12)


def test_top_tokens_maps_and_coverage():
    counts = torch.zeros(20, dtype=torch.long)
    counts[[3, 11, 7, 15]] = torch.tensor([10, 40, 30, 20])
    v = build_vocab(counts, 3)
    assert v.ids.tolist() == [7, 11, 15]  # the three most frequent, ascending
    assert v.padded == 0
    assert (v.ids == torch.arange(3) + v.d2t).all() and (v.d2t >= 0).all()
    assert v.t2d.nonzero().flatten().tolist() == [7, 11, 15]
    assert v.coverage() == pytest.approx(90 / 100)
    held = torch.zeros(20, dtype=torch.long)
    held[[3, 7]] = 5
    report = v.report(held)
    assert report["held_out_coverage"] == pytest.approx(0.5)
    assert report["loss_positions"] == 100 and report["distinct_tokens_seen"] == 4


def test_pads_with_unused_ids_when_too_few_tokens_seen():
    counts = torch.zeros(10, dtype=torch.long)
    counts[[0, 4]] = torch.tensor([3, 1])
    v = build_vocab(counts, 5)
    assert v.size == 5 and v.padded == 3
    assert set(v.ids.tolist()) == {0, 4, 1, 2, 3}
    assert v.coverage() == 1.0


def test_ties_are_deterministic_and_size_checked():
    counts = torch.ones(8, dtype=torch.long)
    assert build_vocab(counts, 3).ids.tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        build_vocab(counts, 9)


def test_a_kept_vocabulary_keeps_the_drafts_order_and_reports_on_the_new_data():
    counts = torch.tensor([0, 5, 0, 3, 2, 0])  # the new data's answer tokens: 1, 3 and 4
    kept = fixed_vocab(torch.tensor([3, 0, 4]), counts)  # head row d stands for ids[d], in the draft's order
    assert kept.ids.tolist() == [3, 0, 4] and kept.padded == 0
    assert kept.report()["coverage"] == pytest.approx(5 / 10)  # token 1, half the positions, is not in it
