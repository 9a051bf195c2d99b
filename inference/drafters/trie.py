"""One row's draft tree as a token trie: inserting a path reuses the nodes it shares with the tree.

    trie = TokenTrie.of(tokens, parents)        # an existing tree (a trained drafter's), nodes 1..n
    nodes = trie.insert([5, 9, 2], origin=1)    # new or shared nodes along the path, parents first
    tree = stack_rows([trie_a, trie_b], fill=[7, 3], device=dev)   # one DraftTree, short rows padded

Nodes are numbered as everywhere in inference/: 0 is the root, node i has parent < i. Padding nodes
hang off the root: any token is lossless there (greedy accepts only the target's own argmax, and a
deterministic node has a one-hot q), so a short row costs verification slots, never correctness.
"""

from __future__ import annotations

import torch

from headway.inference.drafter import DraftTree


class TokenTrie:
    def __init__(self) -> None:
        self.tokens: list[int] = []  # node i + 1's token
        self.parents: list[int] = []  # node i + 1's parent (0 = root)
        self.depth: list[int] = [0]  # per node, the root included
        self.origin: list[int] = [-1]  # per node: who added it first (a candidate rank, a source id)
        self.child: dict[tuple[int, int], int] = {}  # (parent, token) -> node

    @classmethod
    def of(cls, tokens: list[int], parents: list[int], origin: int = 0) -> TokenTrie:
        trie = cls()
        trie.tokens, trie.parents = list(tokens), list(parents)
        depth = trie.depth
        for par in parents:
            depth.append(depth[par] + 1)
        trie.origin += [origin] * len(tokens)
        child = trie.child
        for i, key in enumerate(zip(parents, tokens, strict=True)):
            child.setdefault(key, i + 1)
        return trie

    def __len__(self) -> int:
        return len(self.tokens)

    def _add(self, parent: int, token: int, origin: int) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depth.append(self.depth[parent] + 1)
        self.origin.append(origin)
        node = len(self.tokens)
        self.child.setdefault((parent, token), node)  # a duplicate sibling keeps the first as the match
        return node

    def insert(self, path: list[int], origin: int = 0, limit: int | None = None, start: int = 0) -> list[int]:
        """Nodes along `path` below node `start`, created where missing; stops before the trie would
        exceed `limit` nodes. Returns the nodes reached (a prefix of the path)."""
        nodes, node = [], start
        for tok in path:
            nxt = self.child.get((node, tok))
            if nxt is None:
                if limit is not None and len(self.tokens) >= limit:
                    break
                nxt = self._add(node, tok, origin)
            nodes.append(nxt)
            node = nxt
        return nodes

    def walk(self, path: list[int]) -> list[int]:
        """The nodes along the longest prefix of `path` present in the trie."""
        nodes, node = [], 0
        for tok in path:
            node = self.child.get((node, tok), -1)
            if node < 0:
                break
            nodes.append(node)
        return nodes


def stack_rows(tries: list[TokenTrie], fill: list[int], device) -> DraftTree:
    """Per-row tries -> one DraftTree with parents [B, N]; shorter rows padded with `fill[row]` under the root."""
    N = max(len(t) for t in tries)
    tokens = [t.tokens + [f] * (N - len(t)) for t, f in zip(tries, fill, strict=True)]
    parents = [t.parents + [0] * (N - len(t)) for t in tries]
    B = len(tries)
    return DraftTree(
        torch.tensor(tokens, dtype=torch.long).reshape(B, N).to(device),
        torch.tensor(parents, dtype=torch.long).reshape(B, N).to(device),
    )
