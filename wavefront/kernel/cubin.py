"""Read the resource usage the compiler recorded in a cubin (an ELF file), with no CUDA tools.

Registers per thread are the EIATTR_REGCOUNT entries of the global `.nv.info` section (keyed by
symbol index); static shared memory is the size of `.nv.shared.<kernel>`.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

_EIATTR_REGCOUNT = 0x2F
_EIFMT_SVAL = 0x04


@dataclass(frozen=True)
class KernelResources:
    name: str
    registers: int | None
    shared_bytes: int
    code_bytes: int


def _sections(cubin: bytes):
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    raw = [struct.unpack_from("<IIQQQQII", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = raw[shstrndx][4]

    def name(idx):
        return cubin[names_at + idx:cubin.index(b"\0", names_at + idx)].decode()

    return {name(h[0]): cubin[h[4]:h[4] + h[5]] if h[1] != 8 else h[5] for h in raw}


def _symbol_names(sections) -> list[str]:
    symtab, strtab = sections.get(".symtab", b""), sections.get(".strtab", b"")
    names = []
    for off in range(0, len(symtab), 24):
        idx, = struct.unpack_from("<I", symtab, off)
        names.append(strtab[idx:strtab.index(b"\0", idx)].decode())
    return names


def _register_counts(sections) -> dict[str, int]:
    info = sections.get(".nv.info", b"")
    symbols = _symbol_names(sections)
    counts, off = {}, 0
    while off + 4 <= len(info):
        fmt, attr, size = info[off], info[off + 1], struct.unpack_from("<H", info, off + 2)[0]
        if fmt != _EIFMT_SVAL:
            off += 4
            continue
        if attr == _EIATTR_REGCOUNT and size == 8:
            sym, regs = struct.unpack_from("<II", info, off + 4)
            if sym < len(symbols):
                counts[symbols[sym]] = regs
        off += 4 + size
    return counts


def kernel_resources(cubin: bytes) -> list[KernelResources]:
    sections = _sections(cubin)
    regs = _register_counts(sections)
    found = []
    for name, body in sections.items():
        if name.startswith(".text."):
            kernel = name[len(".text."):]
            shared = sections.get(".nv.shared." + kernel, 0)
            found.append(KernelResources(kernel, regs.get(kernel), shared if isinstance(shared, int)
                                         else len(shared), len(body)))
    return found
