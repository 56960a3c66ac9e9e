"""The two units an SSM target runs per round, as modules the fast mode traces into the round's one graph.

`TreeVerify` builds the tree layout (conv-window indices, ancestor masks) and runs one stock forward with every
Mamba2 mixer's `forward` swapped for the tree mixer; `StateCommit` sets every layer's conv/SSM state to the
accepted node's, in closed form or by replay, in place. The fast mode uses one `TreeSteps` per HF model, shared
by all its adapters (`tree_steps`): the swapped-in mixer functions are created once, so the round's graphs (which
guard on them) are reused across generations and adapters. In eager mode each adapter runs its own.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn

from specmm.core.target import cache_keyword
from specmm.ssm.tree_scan import TreeLayout, TreeRecord, commit_state, replay_state, tree_mixer_forward


class TreePass:
    """What the swapped-in tree mixers of one model read (layout, committed states) and write (records)."""

    def __init__(self, mixers: dict[int, nn.Module]):
        self.mixers = mixers
        self.layout: TreeLayout | None = None
        self.conv: dict[int, Tensor] = {}
        self.ssm: dict[int, Tensor] = {}
        self.scan_dtype: torch.dtype | None = None
        self.prompt: Tensor | bool = False  # [B, n] which nodes are prompt tokens (`tree_mixer_forward`)
        self.records: dict[int, TreeRecord] = {}
        self.forwards = {i: self._tree_forward(m) for i, m in mixers.items()}  # stable: graphs guard on them

    def _tree_forward(self, mixer: nn.Module):
        stock = type(mixer).forward

        def forward(hidden_states, *args, **kwargs):
            if self.layout is None:  # outside a tree pass: the stock mixer
                return stock(mixer, hidden_states, *args, **kwargs)
            out, record = tree_mixer_forward(mixer, hidden_states, self.layout, self.conv[mixer.layer_idx],
                                             self.ssm[mixer.layer_idx], self.scan_dtype, self.prompt)
            self.records[mixer.layer_idx] = record
            return out
        return forward

    def install(self) -> None:
        """Swap the tree mixers in (instance attributes shadow the class method) for a generation: a swap inside
        a round is not something dynamo can trace, so a compiled round could not hold the verify. Outside a tree
        pass (no layout) each runs the stock mixer, so the model works as before even if `uninstall` is missed."""
        for index, mixer in self.mixers.items():
            mixer.forward = self.forwards[index]

    def uninstall(self) -> None:
        """Give the mixers back their stock `forward`."""
        for index, mixer in self.mixers.items():
            if mixer.__dict__.get("forward") is self.forwards[index]:
                del mixer.forward
        self.finish()

    def finish(self) -> None:
        """End a tree pass: the mixers run stock again, and no tensors are held between rounds."""
        self.layout, self.conv, self.ssm, self.records = None, {}, {}, {}


class TreeVerify(nn.Module):
    """Layout + one stock forward over n tree nodes: (logits [B, n', V], {layer: TreeRecord}).

    The tree mixers must be installed (`tree_pass.install()`). `attention_mask` ([B, 1, n, S], hybrids only) goes
    to the attention layers, with `position_ids` and the KV cache `past_key_values`; Mamba2 models take neither.
    """

    def __init__(self, model: nn.Module, tree_pass: TreePass, kernel: int):
        super().__init__()
        self.model, self.tree_pass, self.kernel = model, tree_pass, kernel
        self.cache_keyword = cache_keyword(model)

    def forward(self, input_ids: Tensor, parents: Tensor, depth: Tensor, ancestors: Tensor, valid: Tensor,
                conv: dict[int, Tensor], ssm: dict[int, Tensor], scan_dtype: torch.dtype | None = None,
                attention_mask: Tensor | None = None, position_ids: Tensor | None = None, past_key_values=None,
                logits_to_keep: int = 0, prompt: Tensor | bool = False):
        tree_pass = self.tree_pass
        tree_pass.layout = TreeLayout.build(parents, depth, ancestors, valid, self.kernel)
        tree_pass.conv, tree_pass.ssm, tree_pass.scan_dtype, tree_pass.records = conv, ssm, scan_dtype, {}
        tree_pass.prompt = prompt
        if past_key_values is None:
            out = self.model(input_ids=input_ids, use_cache=False, logits_to_keep=logits_to_keep)
        else:
            out = self.model(input_ids=input_ids, attention_mask={"full_attention": attention_mask,
                                                                  "linear_attention": None},
                             position_ids=position_ids, use_cache=True, **{self.cache_keyword: past_key_values},
                             logits_to_keep=logits_to_keep)
        return out.logits, tree_pass.records


class StateCommit(nn.Module):
    """Write the states after node path[b, counts[b] - 1] of the last verify into `conv`/`ssm`, in place.

    Rows with counts 0 keep their states. `replay=True` re-runs the recurrence over the accepted inputs (the
    vanilla baseline) instead of using the closed form. `ancestors` [B, n, n] is the verify's, passed so a new
    tree shape counts as a new compiled shape.
    """

    def __init__(self, replay: bool = False):
        super().__init__()
        self.replay = replay

    def forward(self, records: dict[int, TreeRecord], path: Tensor, counts: Tensor, ancestors: Tensor,
                conv: dict[int, Tensor], ssm: dict[int, Tensor]) -> Tensor:
        keep = counts > 0  # [B]
        last = path.gather(1, (counts - 1).clamp_min(0)[:, None])[:, 0]  # [B]
        for layer, record in records.items():
            if self.replay:
                new_conv, new_ssm = replay_state(record, path, counts.clamp_min(1))
            else:
                new_conv, new_ssm = commit_state(record, last)
            conv[layer].copy_(torch.where(keep[:, None, None], new_conv.to(conv[layer].dtype), conv[layer]))
            ssm[layer].copy_(torch.where(keep[:, None, None, None], new_ssm.to(ssm[layer].dtype), ssm[layer]))
        return keep


class TreeSteps:
    """The tree pass, verify and commit modules of one model (`commits[replay]`: closed form or replay)."""

    def __init__(self, model: nn.Module, mixers: dict[int, nn.Module]):
        kernel = next(iter(mixers.values())).conv_kernel_size
        self.tree_pass = TreePass(mixers)
        self.verify = TreeVerify(model, self.tree_pass, kernel)
        self.commits = {False: StateCommit(replay=False), True: StateCommit(replay=True)}


_STEPS: weakref.WeakKeyDictionary[nn.Module, TreeSteps] = weakref.WeakKeyDictionary()


def tree_steps(model: nn.Module, mixers: dict[int, nn.Module]) -> TreeSteps:
    """The one `TreeSteps` of `model` for compiled mode (made on first use; kept, like the core's compiled
    forwards, as long as the process runs)."""
    found = _STEPS.get(model)
    if found is None:
        found = _STEPS[model] = TreeSteps(model, mixers)
    return found
