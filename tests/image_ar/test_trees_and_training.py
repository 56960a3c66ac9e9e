"""The LANTERN++ static tree shape, and drafter training that lowers its loss."""

import torch

from specmm.image_ar import ImageDrafter, lantern_pp_tree
from specmm.image_ar.trees import NAIVE_EXTEND_57
from specmm.image_ar.drafter_train import (
    DrafterTrainConfig,
    drafter_loss,
    train_drafter,
)


def test_lantern_pp_tree_has_57_nodes_with_upstream_depth_profile():
    tree = lantern_pp_tree()
    _, _, depths = tree.static_layout
    assert tree.num_nodes == 58  # root + 57 drafts
    assert [depths.count(d) for d in range(1, 6)] == [5, 13, 16, 14, 9]
    # every path's parent is in the tree and ranks under a parent are 0..m-1: a valid choice list
    paths = set(NAIVE_EXTEND_57)
    assert len(paths) == 57 and all(p[:-1] in paths for p in paths if len(p) > 1)
    assert all(p[-1] == 0 or (*p[:-1], p[-1] - 1) in paths for p in paths)
    assert max(p[-1] for p in paths) == 4  # at most 5 children per node (top-5 of the drafter)


def test_drafter_training_lowers_loss_and_round_trips(lg, tmp_path):
    torch.manual_seed(0)
    codes = torch.randint(0, 64, (32, 16))
    codes[:, 1::2] = codes[:, 0::2]  # a learnable pattern: every second token repeats its left neighbour
    labels = torch.randint(0, 10, (32,))
    drafter = ImageDrafter.for_target(lg.gpt)
    target_before = {name: (w.detach().clone(), w.requires_grad) for name, w in lg.gpt.named_parameters()}
    eval_codes, eval_labels = codes[:8], labels[:8]
    before = float(drafter_loss(drafter, eval_labels, eval_codes)[0])
    metrics = list(train_drafter(drafter, codes, labels, DrafterTrainConfig(steps=30, batch_size=8, lr=3e-3),
                                 progress=False))
    after = float(drafter_loss(drafter, eval_labels, eval_codes)[0])
    assert len(metrics) == 30 and after < 0.8 * before
    drafter.save_pretrained(tmp_path / "drafter")
    loaded = ImageDrafter.from_pretrained(tmp_path / "drafter", lg.gpt)
    assert float(drafter_loss(loaded, eval_labels, eval_codes)[0]) == after
    for name, w in lg.gpt.named_parameters():  # the target is not trained, and its flags are the user's again
        assert torch.equal(w, target_before[name][0]) and w.requires_grad == target_before[name][1], name
