"""The work in a batch (hooks/work.py): samples from the lead tensor's first dimension, tokens from
the token tensor's first two dimensions or the declared tokens per sample, read from shapes only."""
from __future__ import annotations

import pytest

from ranksight.hooks.work import batch_work

torch = pytest.importorskip("torch")


def test_a_tuple_of_features_and_per_token_labels():
    x, y = torch.randn(4, 8, 16), torch.randint(0, 8, (4, 8))
    assert batch_work((x, y)) == (4, 32)


def test_a_hugging_face_mapping_counts_input_ids():
    b = {"attention_mask": torch.ones(3, 5, dtype=torch.long), "input_ids": torch.zeros(3, 7, dtype=torch.long)}
    assert batch_work(b) == (3, 21)


def test_images_have_samples_and_no_tokens_unless_declared():
    x, y = torch.randn(6, 3, 4, 4), torch.randint(0, 10, (6,))
    assert batch_work((x, y)) == (6, 0)
    assert batch_work((x, y), tokens_per_sample=1) == (6, 6)
    assert batch_work((x, y), tokens_per_sample=196) == (6, 6 * 196)


def test_a_bool_mask_is_not_a_token_tensor():
    assert batch_work((torch.randn(2, 4), torch.ones(2, 9, dtype=torch.bool))) == (2, 0)


@pytest.mark.parametrize("batch", [None, 3, "text", [], {}, torch.tensor(1.0), [[1, 2], [3, 4]]])
def test_what_holds_no_tensor_with_a_dimension_is_no_work(batch):
    assert batch_work(batch) == (0, 0)


def test_a_nested_tuple_is_looked_into_one_level():
    assert batch_work(((torch.zeros(5, 3, dtype=torch.long), torch.randn(5, 3)), torch.randn(5))) == (5, 15)


def test_no_device_memory_is_read():
    """Shapes only: a meta tensor (no storage at all) gives the same counts."""
    assert batch_work((torch.empty(4, 8, 16, device="meta"), torch.empty(4, 8, dtype=torch.long, device="meta"))) == (4, 32)
