"""Where a warp's float reductions land: each thread's address of every REDG in a cubin's SASS,
from the integer instructions that compute it (no GPU).

The atomic backward's dQ adds are one 32-bit `REDG` per float (tileiras 13.4); what they cost
the memory system depends on how many 32-byte sectors a warp's REDG touches, which depends on
which elements of the tile the compiler gives each lane. `red_addresses` replays the kernel's
integer arithmetic for every thread at once: `S2R` of the thread index, `IMAD`/`LEA`/`SHF`/
`LOP3`/`IADD3`/`VIADD`/moves (32-bit, the low word of 64-bit addresses). Whatever it does not
model (loads, special registers other than the thread index, floating point) it takes as 0 for
every thread, and words of the constant bank (the kernel's scalar parameters, shapes) as 1: a
value common to all threads, so the addresses are right up to an offset per launch, which is
all a sector count needs. It walks the code in address order, through branches and predicates
alike, which suits the straight-line address arithmetic of a tile's scatter; it is a reading
aid for the backward's accumulate, checked against hand-derived layouts
(tests/test_backward.py), not a general emulator.
"""
from __future__ import annotations

import re

import numpy as np

from wavefront.kernel.sass import ADDRESSED

_OPERANDS = re.compile(r",\s*(?![^\[]*\])")
_PREDICATE = re.compile(r"^!?U?P(\d|T)")
_REGISTER = re.compile(r"^U?R\d+$")
# Operations whose destination is data, not an address: the result is unknown (0 here).
_OPAQUE = ("LDS", "LDG", "LDL", "LDSM", "MUFU", "FADD", "FMUL", "FFMA", "F2FP", "SHFL", "I2F",
           "F2I", "FMNMX", "FSEL", "POPC", "FLO", "BREV", "PRMT", "CS2R", "S2UR", "MOV32I",
           "ULDC.64", "LDC.64", "IMAD.HI", "UIMAD.HI")
MASK = 0xFFFFFFFF
SECTOR_BYTES = 32


class _Registers:
    def __init__(self, threads: int):
        self.threads = threads
        self.values: dict[str, np.ndarray] = {}
        self.tid = np.arange(threads, dtype=np.int64)

    def get(self, token: str) -> np.ndarray:
        token = token.strip()
        negate = token.startswith("-")
        token = token.lstrip("-")
        invert = token.startswith("~")
        token = token.lstrip("~")
        name = token.split(".")[0]  # R4.reuse, R2.64
        if name in ("RZ", "URZ"):
            value = np.zeros(self.threads, np.int64)
        elif re.match(r"^0x[0-9a-f]+$", name):
            value = np.full(self.threads, int(name, 16), np.int64)
        elif re.match(r"^\d+$", name):
            value = np.full(self.threads, int(name), np.int64)
        elif _REGISTER.match(name):
            value = self.values.get(name, np.zeros(self.threads, np.int64)).copy()
        elif name.startswith("c["):
            value = np.ones(self.threads, np.int64)
        else:
            value = np.zeros(self.threads, np.int64)
        if invert:
            value = ~value
        return (-value if negate else value) & MASK

    def set(self, destination: str, value: np.ndarray | None):
        name = destination.strip().split(".")[0]
        if value is None:
            value = np.zeros(self.threads, np.int64)
        self.values[name] = value & MASK


def _lop3(a, b, c, lut: int):
    out = np.zeros_like(a)
    for bit in range(32):
        index = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        out |= ((lut >> index) & 1) << bit
    return out


def _next_register(name: str, step: int = 1) -> str:
    prefix = "UR" if name.startswith("UR") else "R"
    return prefix + str(int(name[len(prefix):].split(".")[0]) + step)


def red_addresses(sass: str, threads: int = 384) -> list[tuple[int, np.ndarray]]:
    """(code address, each thread's byte address up to a common offset) of every REDG/ATOMG/RED
    of `sass`, in code order; threads 0 .. threads - 1 (producer warps included)."""
    regs = _Registers(threads)
    found = []
    for address, op, rest in ADDRESSED.findall(sass):
        operands = [o.strip() for o in _OPERANDS.split(rest)] if rest.strip() else []
        if op.startswith(("REDG", "ATOMG", "RED.")):
            at = re.search(r"\]\s*\[(U?R\d+)(?:\.64)?(?:\+U?R\d+)?(?:\+(-?0x[0-9a-f]+))?\]", rest)
            if at:
                offset = int(at.group(2), 16) if at.group(2) else 0
                found.append((int(address, 16), regs.get(at.group(1)) + offset))
            continue
        if not operands or op.startswith(("ISETP", "FSETP", "PLOP3", "BRA", "BAR", "SYNCS")):
            continue
        operands = [o for o in operands if not _PREDICATE.match(o)]
        if not operands:
            continue
        dest, src = operands[0], operands[1:]
        base = op.split(".")[0]
        if base == "S2R":
            regs.set(dest, regs.tid if "TID.X" in src[0] else None)
        elif op in ("LDC", "ULDC"):
            regs.set(dest, np.ones(threads, np.int64))  # a scalar parameter or a shape
        elif op.startswith(_OPAQUE):
            regs.set(dest, None)
            for extra in range(1, {"64": 2, "128": 4}.get(op.rsplit(".", 1)[-1], 1)):
                regs.set(_next_register(dest, extra), None)
        elif base in ("MOV", "UMOV"):
            regs.set(dest, regs.get(src[-1]))
        elif op.startswith(("IMAD.WIDE", "UIMAD.WIDE")):
            a, b, c = (regs.get(x) for x in src[:3])
            regs.set(dest, a * b + c)
            regs.set(_next_register(dest), None)  # the high word: part of the common offset
        elif op.startswith(("IMAD.X", "IADD3.X", "LEA.HI.X", "UIADD3.X", "ULEA.HI.X")):
            regs.set(dest, None)  # high words of 64-bit addresses
        elif op.startswith(("LEA.HI", "ULEA.HI")):  # (c:a) >> (32 - s) + b
            a, b = regs.get(src[0]), regs.get(src[1])
            c = regs.get(src[2]) if len(src) > 3 else np.zeros(threads, np.int64)
            shift = int(src[-1], 16)
            regs.set(dest, (((c << 32) | a) >> (32 - shift)) + b)
        elif base in ("IMAD", "UIMAD"):
            a, b, c = (regs.get(x) for x in src[:3])
            regs.set(dest, a * b + c)
        elif base in ("LEA", "ULEA"):
            a, b = regs.get(src[0]), regs.get(src[1])
            shift = int(src[2], 16) if src[2].startswith("0x") else 0
            regs.set(dest, (a << shift) + b)
        elif base in ("SHF", "USHF"):
            if ".L" in op:
                regs.set(dest, regs.get(src[0]) << (regs.get(src[1]) & 31))
            else:
                regs.set(dest, regs.get(src[2]) >> (regs.get(src[1]) & 31))
        elif base in ("LOP3", "ULOP3"):
            a, b, c = (regs.get(x) for x in src[:3])
            regs.set(dest, _lop3(a, b, c, int(src[3], 16)))
        elif base in ("IADD3", "UIADD3"):
            regs.set(dest, sum(regs.get(x) for x in src[:3]))
        elif base == "VIADD":
            regs.set(dest, regs.get(src[0]) + regs.get(src[1]))
        elif base in ("SEL", "USEL"):
            regs.set(dest, regs.get(src[0]))  # bounds and division fix-ups: common values
        elif base == "R2UR":
            regs.set(dest, np.full(threads, regs.get(src[0])[0]))
        elif dest.startswith(("R", "UR")) and _REGISTER.match(dest.split(".")[0]):
            regs.set(dest, None)
    return found


def sectors_per_red(sass: str, threads: int = 384, warp: int = 32) -> list[float]:
    """For every REDG of `sass`: the 32-byte sectors one warp's 32 adds touch, the mean over
    the warps of `threads` (4 at best for 32-bit adds: 128 contiguous bytes; 32 at worst),
    counted from the lowest address of the instruction's threads."""
    out = []
    for _, addresses in red_addresses(sass, threads):
        # relative to the instruction's lowest address (taken as sector-aligned: the common
        # offset is unknown), the 32-bit words' wrap-around undone
        relative = ((addresses - addresses[0] + (1 << 31)) & MASK) - (1 << 31)
        relative -= relative.min()
        per_warp = [len(np.unique(relative[w:w + warp] // SECTOR_BYTES))
                    for w in range(0, threads, warp)]
        out.append(float(np.mean(per_warp)))
    return out
