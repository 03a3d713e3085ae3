"""Closed-form counts of one launch: FLOPs, L2 sector accesses, compulsory DRAM bytes.

Counts come from the tiles the kernel actually visits (`kv_tile_span`, the same function the
kernel calls), so the causal count includes the diagonal tiles and the ragged ends.
"""
from __future__ import annotations

from dataclasses import dataclass

from wavefront.point import SECTOR_BYTES
from wavefront.schedules import AttentionProblem, partial_row_bytes as float32_partial_row


@dataclass(frozen=True)
class LaunchCounts:
    useful_flops: float  # 4 * D per (query, visible key) pair: what the peers are credited with
    executed_flops: float  # 4 * D per (query row, key column) of every visited tile, masks included
    q_read_sectors: int
    kv_read_sectors: int
    o_write_sectors: int
    compulsory_read_bytes: int  # Q, K, V once (+ the partial states, tiled)
    compulsory_write_bytes: int  # O once (+ the partial states, tiled)
    partial_state_bytes: int = 0  # tiled: fp32 (output, row max, row sum) of every chunk

    @property
    def read_sectors(self) -> int:
        """Reads the kernels issue: Q and K/V (+ the combine's partial-state reads, tiled)."""
        return self.q_read_sectors + self.kv_read_sectors + self.partial_state_bytes // SECTOR_BYTES

    @property
    def sectors(self) -> int:
        return self.read_sectors + self.o_write_sectors


def _row_sectors(rows: int, p: AttentionProblem) -> int:
    # Rows are contiguous head_dim vectors; a tile of rows spans rows*D*E bytes.
    return -(-rows * p.head_dim * p.element_bytes // SECTOR_BYTES)


def useful_pairs_per_head(p: AttentionProblem) -> int:
    """(query, key) pairs that carry weight: all of them, or the causal lower-left triangle."""
    if not p.causal:
        return p.seqlen_q * p.seqlen_kv
    # Query row r sees min(r + diagonal + 1, seqlen_kv) keys, none where that is below 1:
    # rows [0, lo) none, [lo, hi) r + diagonal + 1, [hi, seqlen_q) all of them.
    d, sq, skv = p.diagonal, p.seqlen_q, p.seqlen_kv
    lo = min(max(-d, 0), sq)
    hi = min(max(skv - d - 1, lo), sq)
    return (hi - lo) * (d + 1) + (lo + hi - 1) * (hi - lo) // 2 + (sq - hi) * skv


def launch_counts(p: AttentionProblem, n_chunks: int = 1,
                  partial_row_bytes: int | None = None) -> LaunchCounts:
    """Counts for `p`; `n_chunks` > 1 (the tiled schedule) adds the partial states, written
    by the attention kernel and read back by the combine kernel, `partial_row_bytes` per row
    (default: a float32 output row plus the row maximum and sum)."""
    heads = p.batch * p.heads
    q_sectors = kv_sectors = 0
    executed_pairs = 0
    for q_tile in range(p.q_tiles):
        rows = min(p.tile_m, p.seqlen_q - q_tile * p.tile_m)
        visited, _ = p.kv_span(q_tile)
        q_sectors += _row_sectors(rows, p)
        cols = min(visited * p.tile_n, p.seqlen_kv)
        # K and V, each of the visited tiles, the ragged last tile clipped by the TMA box.
        kv_sectors += 2 * _row_sectors(cols, p)
        executed_pairs += p.tile_m * visited * p.tile_n
    flop_per_pair = 4 * p.head_dim
    q_bytes = p.seqlen_q * p.head_dim * p.element_bytes
    kv_bytes = 2 * p.seqlen_kv * p.head_dim * p.element_bytes
    row = partial_row_bytes if partial_row_bytes is not None else float32_partial_row(p.head_dim)
    partial = n_chunks * heads * p.seqlen_q * row if n_chunks > 1 else 0
    return LaunchCounts(
        useful_flops=float(flop_per_pair * useful_pairs_per_head(p) * heads),
        executed_flops=float(flop_per_pair * executed_pairs * heads),
        q_read_sectors=q_sectors * heads,
        kv_read_sectors=kv_sectors * heads,
        o_write_sectors=_row_sectors(p.seqlen_q, p) * heads,
        compulsory_read_bytes=q_bytes * heads + kv_bytes * p.batch * p.kv_heads + partial,
        compulsory_write_bytes=q_bytes * heads + partial,
        partial_state_bytes=partial,
    )


def paper_sector_count(seqlen: int, head_dim: int, tile_q: int, element_bytes: int = 2) -> float:
    """Zhu et al.'s closed form per (batch, head), non-causal: M = 2 S (D E / C) (1 + S / T_q)."""
    return 2 * seqlen * (head_dim * element_bytes / SECTOR_BYTES) * (1 + seqlen / tile_q)
