"""What the machine code of a compiled kernel says: the few SASS facts that decided speed here.

The schedule-cost investigation came down to three observable properties of a Hopper
attention cubin: whether the warpgroup MMAs are pipelined (an HGMMA issued while the previous
ones run) or serialised (a `WARPGROUP.DEPBAR` wait after every HGMMA), whether registers spill to
local memory (`LDL`/`STL`), and whether the kernel is warp-specialised (`USETMAXREG`: the
producer warps give registers to the consumers). `sass_summary` counts them from `cuobjdump`.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


def _find(tool: str) -> str | None:
    """`tool` on PATH, from the NVIDIA pip wheels (the gpu extra), or Triton's copy."""
    found = shutil.which(tool)
    if found:
        return found
    for site in sys.path:
        cand = Path(site) / "nvidia" / "cu13" / "bin" / tool
        if cand.is_file():
            return str(cand)
    try:
        import triton
        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool
        return str(cand) if cand.exists() else None
    except ImportError:
        return None


def find_cuobjdump() -> str | None:
    """cuobjdump, where `disassemble` can also find the nvdisasm it needs for SASS."""
    tool = _find("cuobjdump")
    return tool if tool and _find("nvdisasm") else None


def disassemble(cubin: bytes) -> str:
    """SASS text of a cubin (needs cuobjdump)."""
    tool = find_cuobjdump()
    if tool is None:
        raise RuntimeError("cuobjdump and nvdisasm not found: install the gpu extra "
                           "(nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm) or put a CUDA "
                           "toolkit's bin/ on PATH")
    # cuobjdump runs nvdisasm for SASS: tell it where the one we found lives.
    env = {**os.environ, "NVDISASM_PATH": str(Path(_find("nvdisasm")).parent)}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        out = subprocess.run([tool, "-sass", path], capture_output=True, text=True, timeout=300,
                             env=env)
    if out.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {out.stderr.strip()[:200]}")
    return out.stdout


_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", re.M)


@dataclass(frozen=True)
class SassSummary:
    instructions: int
    hgmma: int  # warpgroup MMAs
    depbar: int  # waits for outstanding warpgroup MMAs
    local_loads: int  # LDL: spilled registers read back
    local_stores: int  # STL
    setmaxnreg: int  # register reallocation between warpgroups (warp specialisation)

    @property
    def wgmma_pipelined(self) -> bool:
        """False when the compiler waits after (nearly) every HGMMA."""
        return self.hgmma > 0 and self.depbar * 2 < self.hgmma

    def as_dict(self) -> dict:
        return {**self.__dict__, "wgmma_pipelined": self.wgmma_pipelined}


def summarise(sass: str) -> SassSummary:
    ops = _INSTRUCTION.findall(sass)

    def count(prefix):
        return sum(op.startswith(prefix) for op in ops)
    return SassSummary(len(ops), count("HGMMA"), count("WARPGROUP.DEPBAR"), count("LDL"),
                       count("STL"), count("USETMAXREG"))


def sass_summary(cubin: bytes) -> SassSummary:
    return summarise(disassemble(cubin))


# The K/V loop's instructions by what they do: the MMAs and exponentials scale with the keys a
# step covers, the row reductions, waits and the accumulator's rescale with the steps.
LOOP_CLASSES = (
    ("warpgroup MMA", ("HGMMA",)),
    ("exponential", ("MUFU.EX2",)),
    ("FP32 add/mul/fma", ("FFMA", "FMUL", "FADD")),
    ("max", ("FMNMX",)),
    ("shuffle", ("SHFL",)),
    ("convert to 16-bit", ("F2FP",)),
    ("wait or barrier", ("SYNCS", "BAR", "WARPGROUP", "WARPSYNC", "DEPBAR")),
)
# An instruction with its code address: (address, opcode, operands); `backward_sass` reads it too
ADDRESSED = re.compile(
    r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def loops(sass: str) -> list[tuple[int, int, list[str]]]:
    """Every loop of the code: (first address, address of its backward branch, the opcodes in
    between), one per backward branch."""
    code = [(int(address, 16), op, rest) for address, op, rest in ADDRESSED.findall(sass)]
    found = []
    for address, op, rest in code:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < address:
            start = int(target.group(1), 16)
            found.append((start, address, [o for a, o, _ in code if start <= a <= address]))
    return found


def kv_loop_mix(sass: str) -> dict[str, int]:
    """Instructions of the attention kernel's steady K/V step, by `LOOP_CLASSES` (and 'other',
    'all'): the shortest loop with both warpgroup MMAs and exponentials in it, i.e. the
    innermost K/V loop without the mask's arithmetic. (A loop of MMAs alone is not one: a
    branch back from out-of-line code can span the P V MMAs of the epilogue.)"""
    steps = [body for _, _, body in loops(sass)
             if any(o.startswith("HGMMA") for o in body)
             and any(o.startswith("MUFU.EX2") for o in body)]
    if not steps:
        raise ValueError("no loop with warpgroup MMAs (HGMMA) and exponentials in this code")
    body = min(steps, key=len)
    counts = {name: sum(o.split(".")[0] in prefixes or o.startswith(prefixes) for o in body)
              for name, prefixes in LOOP_CLASSES}
    counts["other"] = len(body) - sum(counts.values())
    counts["all"] = len(body)
    return counts


_HGMMA_SHAPE = re.compile(r"HGMMA\.(\d+)x(\d+)x(\d+)")
# What a backward loop's instructions are, by the resource they use (`mma_loop_table`).
MMA_LOOP_CLASSES = (
    ("hgmma", ("HGMMA",)),
    ("ex2", ("MUFU.EX2",)),
    ("lds", ("LDS", "LDSM")),
    ("sts", ("STS", "STSM")),
    ("ldg", ("LDG",)),
    ("red", ("RED", "ATOM")),
    ("ldl", ("LDL",)),
    ("stl", ("STL",)),
    ("barriers", ("SYNCS", "BAR", "WARPGROUP", "DEPBAR")),
    ("isetp", ("ISETP",)),  # integer compares: a masked loop's mask, besides the loop's own
)


def mma_loop_table(sass: str) -> list[dict]:
    """Every innermost loop that does tensor-core work and exponentials (the backward's K/V or
    Q loops: one per masked/unmasked loop and per warpgroup copy), as its instruction counts by
    `MMA_LOOP_CLASSES`, its length, and `macs`: multiply-accumulates its warpgroup MMAs issue
    per trip (m x n x k of each HGMMA, per warpgroup). Sorted by address."""
    lines = [(int(a, 16), line) for a, line in
             re.findall(r"/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P\w+\s+)?[A-Z][^;]*);", sass)]
    # A branch back from out-of-line code (barrier retries, the producer's TMA issue) spans
    # pieces of several roles and is no loop of one: such spans hold UTMALDG or NANOSLEEP.
    spans = [(a, b) for a, b, body in loops(sass)
             if any(o.startswith("HGMMA") for o in body)
             and any(o.startswith("MUFU.EX2") for o in body)
             and not any(o.startswith(("UTMALDG", "NANOSLEEP")) for o in body)]
    innermost = [(a, b) for a, b in spans
                 if not any((a, b) != (c, d) and a <= c and d <= b for c, d in spans)]
    table = []
    for start, end in sorted(set(innermost)):
        ops = [re.sub(r"^@!?U?P\w+\s+", "", line).split()[0] for a, line in lines
               if start <= a <= end]
        row = {"start": start, "instructions": len(ops)}
        for name, prefixes in MMA_LOOP_CLASSES:
            row[name] = sum(o.split(".")[0] in prefixes or o.startswith(prefixes) for o in ops)
        row["macs"] = sum(int(m[1]) * int(m[2]) * int(m[3])
                          for m in map(_HGMMA_SHAPE.match, ops) if m)
        table.append(row)
    return table
