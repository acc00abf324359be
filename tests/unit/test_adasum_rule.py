"""Adasum's combination rule (``runtime.dataplane.adasum``): Horovod's behaviour for orthogonal and parallel
vectors, zero vectors, per-tensor coefficients in a fused buffer, fp16, and the tree for any number of
ranks (the distributed version is checked against this reference in tests/integration/test_adasum.py)."""

import torch

from torchring.runtime.dataplane.adasum import adasum_pair, adasum_reference


def test_orthogonal_vectors_add_up_and_identical_ones_are_kept_once():
    a, b = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 2.0, 0.0])
    torch.testing.assert_close(adasum_pair(a, b), a + b)
    g = torch.tensor([0.5, -1.5, 2.0])
    torch.testing.assert_close(adasum_pair(g, g), g)
    torch.testing.assert_close(adasum_pair(g, 3 * g), (1 - 3 / 2) * g + (1 - 1 / 6) * 3 * g)  # parallel: 2g


def test_the_rule_in_general_and_a_zero_vector_leaves_the_other():
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0])
    dot = float(a @ b)
    expected = (1 - dot / (2 * float(a @ a))) * a + (1 - dot / (2 * float(b @ b))) * b
    torch.testing.assert_close(adasum_pair(a, b), expected)
    zero = torch.zeros(2)
    torch.testing.assert_close(adasum_pair(zero, b), b)
    torch.testing.assert_close(adasum_pair(a, zero), a)


def test_coefficients_are_per_tensor_in_a_fused_buffer():
    first_a, first_b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])  # orthogonal: summed
    second = torch.tensor([2.0, 2.0, 2.0])  # identical: kept once
    fused = adasum_pair(torch.cat([first_a, second]), torch.cat([first_b, second]), [(0, 2), (2, 5)])
    torch.testing.assert_close(fused, torch.cat([first_a + first_b, second]))
    whole = adasum_pair(torch.cat([first_a, second]), torch.cat([first_b, second]))  # one tensor: not the same
    assert not torch.allclose(whole, fused)


def test_fp16_is_combined_in_wide_precision_and_stays_fp16():
    a = torch.randn(256, generator=torch.Generator().manual_seed(0)).half()
    b = torch.randn(256, generator=torch.Generator().manual_seed(1)).half()
    combined = adasum_pair(a, b)
    assert combined.dtype == torch.float16
    torch.testing.assert_close(combined.float(), adasum_pair(a.double(), b.double()).float(), rtol=1e-3, atol=1e-3)


def test_the_tree_pairs_neighbours_first_and_folds_extra_ranks_in():
    vectors = [torch.randn(6, generator=torch.Generator().manual_seed(seed)) for seed in range(5)]
    v = vectors
    torch.testing.assert_close(adasum_reference(v[:2]), adasum_pair(v[0], v[1]))
    four = adasum_pair(adasum_pair(v[0], v[1]), adasum_pair(v[2], v[3]))
    torch.testing.assert_close(adasum_reference(v[:4]), four)
    three = adasum_pair(adasum_pair(v[0], v[2]), v[1])  # rank 2 folds into rank 0, then (0, 1)
    torch.testing.assert_close(adasum_reference(v[:3]), three)
    five = adasum_pair(adasum_pair(adasum_pair(v[0], v[4]), v[1]), adasum_pair(v[2], v[3]))
    torch.testing.assert_close(adasum_reference(v), five)
    torch.testing.assert_close(adasum_reference(v[:1]), v[0])
