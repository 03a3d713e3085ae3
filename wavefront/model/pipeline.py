"""The K/V pipeline a kernel binary has, read from its SASS (text from `cuobjdump -sass`).

tileiras warp-specialises the attention loop: a producer warp issues the K and V loads (TMA,
`UTMALDG`) into rings of shared-memory stages guarded by mbarriers, the consumer warpgroups
wait on a stage's barrier (`SYNCS.PHASECHK`), compute, and release it (`SYNCS.ARRIVE`). How
far ahead of the consumer the loads can run is the number of stages of each ring: the producer
wraps its stage counter with a multiply-high division and a `UIMAD idx, q, -N, idx`, N the
ring's length (a power-of-two ring wraps with `idx &= N - 1` instead). A K/V step needs both
its K and its V, so the steps whose loads are in flight together are the shorter ring's
(`loads_ahead`); the timed model simulates the two rings apart (`model.timed`). Parsed here from the text, so the model stays free of the compiler; the kernel layer
(`wavefront.kernel.sass`) has the disassembler.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

_ADDRESSED = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
_WRAP = re.compile(r"UR\w+,\s*UR\w+,\s*-0x([0-9a-f]+),\s*UR\w+")
_MASK = re.compile(r"(UR\d+),\s*\1,\s*0x([0-9a-f]+),\s*URZ,\s*0xc0")  # idx &= N - 1
_EXPECT = re.compile(r"(?:MOV\s+R\d+,\s*|IMAD\.MOV\.U32\s+R\d+,\s*RZ,\s*RZ,\s*)0x([0-9a-f]+)")


@dataclass(frozen=True)
class KvPipeline:
    """The K/V pipeline of one binary."""

    k_stages: int  # the K ring's length: K loads the producer can have ahead of the consumer
    v_stages: int
    bytes_per_load: int  # the transaction bytes one stage's barrier expects (a K or V tile)
    consumer_waits: int  # barrier waits (SYNCS.PHASECHK) per step of the consumer's K/V loop
    consumer_releases: int  # stage releases (SYNCS.ARRIVE) per consumer step

    @property
    def loads_ahead(self) -> int:
        """K/V steps whose loads can be in flight per consumer: a step needs both tiles."""
        return min(self.k_stages, self.v_stages)

    def as_dict(self) -> dict:
        return {**self.__dict__, "loads_ahead": self.loads_ahead}


def _code(sass: str) -> list[tuple[int, str, str]]:
    return [(int(a, 16), op, (pred or "") + op + rest)
            for a, pred, op, rest in _ADDRESSED.findall(sass)]


def _loops(code) -> list[list[tuple[int, str, str]]]:
    found = []
    for address, op, text in code:
        target = re.search(r"0x([0-9a-f]+)", text) if op == "BRA" else None
        if target and int(target.group(1), 16) < address:
            start = int(target.group(1), 16)
            found.append([c for c in code if start <= c[0] <= address])
    return found


def _rings(body) -> list[tuple[int, int]]:
    """(stages, expected bytes) of each ring a producer loop fills. A ring is the loads before
    one expect-tx arrive (`SYNCS.ARRIVE.TRANS64 RZ, [bar], Rn`). A multi-stage ring wraps its
    stage counter with `UIMAD idx, q, -N, idx`; the scheduler moves those wraps about the loop,
    so they are matched to rings in order of appearance, and a ring left without one flips its
    barrier's phase every step: one stage. (The lookahead, the shortest ring, does not depend
    on that matching.)"""
    wraps = []
    for _, op, t in body:
        wrap = _WRAP.search(t) if op == "UIMAD" else None
        mask = _MASK.search(t) if op == "ULOP3.LUT" else None
        if wrap:
            wraps.append(int(wrap.group(1), 16))
        elif mask and int(mask.group(2), 16) < 64 and not int(mask.group(2), 16) & (
                int(mask.group(2), 16) + 1):  # a power-of-two ring: idx &= N - 1
            wraps.append(int(mask.group(2), 16) + 1)
    rings, lo = [], 0
    for i, (_, op, t) in enumerate(body):
        if not (op.startswith("SYNCS.ARRIVE.TRANS64") and ".A1T0" not in op
                and re.search(r"\],\s*R\d+", t)):
            continue
        if any(o.startswith("UTMALDG") for _, o, _ in body[lo:i]):
            tx = [int(m.group(1), 16) for _, _, x in body[lo:i + 1] for m in [_EXPECT.search(x)]
                  if m]
            rings.append(tx[-1] if tx else 0)
        lo = i + 1
    stages = wraps[:len(rings)] + [1] * max(0, len(rings) - len(wraps))
    return list(zip(stages, rings))


def kv_pipeline(sass: str) -> KvPipeline:
    """The binary's K/V pipeline (see the module docstring). Raises ValueError naming what is
    missing where the code does not have the producer/consumer shape this parser knows (one
    producer loop filling a K ring and a V ring)."""
    loops = _loops(_code(sass))
    producers = [(b, _rings(b)) for b in loops
                 if any(op.startswith("UTMALDG") for _, op, _ in b)
                 and not any(op.startswith("HGMMA") for _, op, _ in b)]
    producers = [(b, r) for b, r in producers if len(r) == 2]
    if not producers:
        raise ValueError("no producer loop filling two rings (K and V: TMA loads, UTMALDG, "
                         "each ring closed by an expect-tx arrive) without HGMMA in this code")
    body, ((k_stages, k_bytes), (v_stages, v_bytes)) = min(producers, key=lambda br: len(br[0]))
    # (which ring is K and which V is the order of their loads; the lookahead is the shorter)
    consumers = [b for b in loops if any(op.startswith("HGMMA") for _, op, _ in b)
                 and any(op.startswith("MUFU.EX2") for _, op, _ in b)]
    if not consumers:
        raise ValueError("no consumer K/V loop (HGMMA and MUFU.EX2) in this code")
    step = min(consumers, key=len)
    return KvPipeline(k_stages=k_stages, v_stages=v_stages, bytes_per_load=max(k_bytes, v_bytes),
                      consumer_waits=sum(op.startswith("SYNCS.PHASECHK") for _, op, _ in step),
                      consumer_releases=sum(op.startswith("SYNCS.ARRIVE") for _, op, _ in step))


# The binaries' pipelines as read (data/kv_pipeline/pipeline.json in the checkout)
PIPELINE_DATA = Path(__file__).resolve().parents[2] / "data" / "kv_pipeline" / "pipeline.json"
# Where a binary was not read (a variant not compiled, or no checkout): two steps, the
# assumption the timed model used before the SASS was read
ASSUMED_LOADS_AHEAD = 2


@lru_cache(maxsize=4)
def read_stages(path: Path = PIPELINE_DATA) -> dict[tuple, tuple[int, int]]:
    """(head_dim, tile_m, tile_n, causal, occupancy) -> (K stages, V stages), from the file
    `kv_pipeline` summaries were saved to ({} when it is absent). A malformed file is an
    error naming it and the field."""
    if not Path(path).exists():
        return {}
    try:
        binaries = json.loads(Path(path).read_text())["binaries"]
        return {(int(b["head_dim"]), int(b["tile_m"]), int(b["tile_n"]), bool(b["causal"]),
                 int(b["occupancy"])): (int(b["k_stages"]), int(b["v_stages"]))
                for b in binaries.values()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: every entry of 'binaries' needs head_dim, tile_m, tile_n, "
                         f"causal, occupancy, k_stages and v_stages ({exc.__class__.__name__}: "
                         f"{exc})") from None


def read_depths(path: Path = PIPELINE_DATA) -> dict[tuple, int]:
    """(head_dim, tile_m, tile_n, causal, occupancy) -> K/V steps in flight (the shorter
    ring), from the same file as `read_stages`."""
    return {key: min(stages) for key, stages in read_stages(path).items()}


def kv_stages_of(launch, path: Path = PIPELINE_DATA) -> tuple[tuple[int, int] | None, str]:
    """((K stages, V stages), where they come from) for the binary a launch runs, read from
    its SASS (static binary of its variant; dynamic schedules' binaries share its pipeline
    code); (None, why) where the binary was not read."""
    p = launch.problem
    key = (p.head_dim, p.tile_m, p.tile_n, bool(p.causal), launch.ctas_per_sm)
    stages = read_stages(path).get(key)
    if stages is None:
        return None, "assumed (binary not read)"
    return stages, "read from the binary's SASS"


def loads_ahead_of(launch, path: Path = PIPELINE_DATA) -> tuple[int, str]:
    """(K/V steps in flight, where that comes from) for the binary a launch runs: the shorter
    of its rings as read (`kv_stages_of`), or assumed."""
    stages, source = kv_stages_of(launch, path)
    return (ASSUMED_LOADS_AHEAD if stages is None else min(stages)), source
