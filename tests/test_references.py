"""A graph's reference record (scripts/release/references.py): what it holds, and what it refuses."""

from __future__ import annotations

import pytest
import torch

from scripts.release import references


def test_a_row_reference_holds_the_hidden_at_its_real_positions_only():
    """Broken once: hidden states of every padded position (or of too few) would be compared against
    the graph's real positions one for one, shifted; the record refuses them."""
    record = {"inputs_embeds": torch.zeros(1, 6, 4), "valid": torch.tensor([[1, 1, 1, 1, 0, 0]], dtype=torch.float32)}
    made = references.row_reference(record, torch.ones(4, 4))
    assert made["expected"].shape == (1, 4, 4) and made["valid"] is record["valid"]
    for wrong in (6, 3):
        with pytest.raises(ValueError, match=f"the hidden at the 4 real positions, got {wrong}"):
            references.row_reference(record, torch.ones(wrong, 4))
