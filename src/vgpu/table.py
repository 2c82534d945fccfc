"""Action results that fit what Juju's ``action-set`` accepts.

``event.set_results`` flattens nested results into ``a.b.c=value`` and hands
every pair to ``action-set`` as one command-line argument. Linux refuses a
single argument over 128 KiB and an argument list over about 2 MiB
(``Argument list too long``); a host with thousands of vGPU types or guests
exceeds both. Juju's own output also stops being readable long before.

So every action that reports a list goes through here:

* ``lines`` does the same for a list said one item to a line;
* ``render`` lays rows out as a fixed-width table of at most ``MAX_ROWS``
  rows and ``MAX_TABLE_BYTES`` bytes, and says how many rows it left out;
* ``fit`` keeps the nested results under ``MAX_RESULTS_BYTES`` (as
  ``action-set`` would receive them) by dropping whole records from the end,
  never half a record, and says so in a ``truncated`` key.

Plain functions on plain data: no ops, no host access.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

MAX_ROWS = 100
MAX_TABLE_BYTES = 12_000
MAX_RESULTS_BYTES = 48_000
MAX_VALUE_BYTES = 16_384  # a bounded table fits; one argument may hold 128 KiB
TRUNCATED_KEY = "truncated"


def render(header: Sequence[str], rows: Sequence[Sequence[str]], *, what: str = "rows",
           where: str = "the nested results", max_rows: int = MAX_ROWS,
           max_bytes: int = MAX_TABLE_BYTES) -> str:
    """A fixed-width table of ``header`` and ``rows``, bounded in rows and bytes.

    Rows beyond the bounds are summarised in a last line:
    ``... and 1900 more rows; see the nested results``.
    """
    header = [_cell(c) for c in header]
    body = [[_cell(c) for c in row] for row in rows]
    shown = body[:max_rows]
    while True:
        text = _layout(header, shown)
        left = len(body) - len(shown)
        if left:
            text += f"\n... and {left} more {what}; see {where}"
        if len(text.encode()) <= max_bytes or not shown:
            return text
        # Drop rows in proportion to the overshoot (at least one) and lay out again.
        ratio = max_bytes / len(text.encode())
        shown = shown[:min(len(shown) - 1, int(len(shown) * ratio))]


def lines(items: Sequence[str], *, what: str = "lines", where: str = "the nested results",
          max_bytes: int = MAX_VALUE_BYTES) -> str:
    """``items`` one to a line, whole lines only, within ``max_bytes`` (a value ``fit`` keeps whole).

    Lines beyond the bound are summarised in a last line, as :func:`render` does:
    ``... and 9 more guests; see juju run gpu-a/0 vgpu-usage``.
    """
    items = [" ".join(_cell(item).split()) for item in items]
    text = "\n".join(items)
    if len(text.encode()) <= max_bytes:
        return text
    shown: List[str] = []
    used = 0
    for item in items:
        tail = f"... and {len(items) - len(shown) - 1} more {what}; see {where}"
        size = len(item.encode()) + 1
        if used + size + len(tail.encode()) > max_bytes:
            break
        shown.append(item)
        used += size
    return "\n".join(shown + [f"... and {len(items) - len(shown)} more {what}; see {where}"])


def fit(results: Dict[str, object], *, depth: int, records: str, what: str = "entries",
        budget: int = MAX_RESULTS_BYTES) -> Dict[str, object]:
    """``results`` with whole records dropped from the end until they fit ``budget``.

    ``records`` names the top-level key that holds the list (``gpus``,
    ``vgpus``); a record is everything under one key path ``depth`` levels
    deep (``gpus.gpu-0.types.nvidia-105`` at depth 4), or a shallower leaf
    (a GPU's address) on its own. Everything else (a summary, totals, the
    table) takes its room first, in order; then each record's shallower
    fields (a GPU's addresses and model), so every one stays named; records
    fill what is left, in order. When anything is dropped, a ``truncated`` key says how many
    records of how many are shown. Long values are cut to ``MAX_VALUE_BYTES``.
    """
    groups: List[Tuple[tuple, List[Tuple[tuple, object]]]] = []
    for path, value in flatten(results):
        key = path[:min(depth, len(path) - 1)] if len(path) > 1 else path
        if path[0] != records:
            key = path[:2]  # totals and such: one entry each
        if groups and groups[-1][0] == key:
            groups[-1][1].append((path, _value(value)))
        else:
            groups.append((key, [(path, _value(value))]))
    used = 300  # room for the truncated note itself
    kept: List[int] = []
    # Each record's own shallower fields (a GPU's addresses) before any record, so that
    # every record stays named when its details are dropped.
    order = ([i for i, g in enumerate(groups) if g[0][0] != records]
             + [i for i, g in enumerate(groups) if g[0][0] == records and len(g[0]) < depth]
             + [i for i, g in enumerate(groups) if g[0][0] == records and len(g[0]) >= depth])
    full = False
    for index in order:
        size = sum(_size(p, v) for p, v in groups[index][1])
        if full or used + size > budget:
            full = True
            continue
        used += size
        kept.append(index)
    out: Dict[str, object] = {}
    for index in sorted(kept):
        for path, value in groups[index][1]:
            _put(out, path, value)
    counted = [i for i, (key, _) in enumerate(groups) if key[0] == records and len(key) == depth]
    shown = len(set(counted) & set(kept))
    if len(kept) < len(groups):
        out[TRUNCATED_KEY] = (f"{shown} of {len(counted)} {what} shown in the nested results; "
                              "the rest left out to stay within what Juju's action-set accepts")
    return out


def flatten(results: Dict[str, object], prefix: tuple = ()) -> List[Tuple[tuple, object]]:
    """``[(("gpus", "gpu-0", "address"), "0000:c1:00.0"), ...]`` in order."""
    out: List[Tuple[tuple, object]] = []
    for key, value in results.items():
        path = prefix + (str(key),)
        if isinstance(value, dict) and value:
            out.extend(flatten(value, path))
        else:
            out.append((path, value))
    return out


def _size(path: tuple, value) -> int:
    if value == {}:
        return 0  # nothing reaches action-set for an empty mapping
    # "a.b.c=value" plus its NUL terminator and the argv pointer.
    return len(".".join(path).encode()) + 1 + len(str(value).encode()) + 1 + 8


def _value(value):
    if value == {}:
        return {}
    text = "" if value is None else (value if isinstance(value, str) else str(value))
    text = text.replace("\x00", "?")  # a NUL cannot be passed as a command-line argument
    if len(text.encode()) > MAX_VALUE_BYTES:
        text = text.encode()[:MAX_VALUE_BYTES - 3].decode(errors="ignore") + "..."
    return text


def _put(tree: Dict[str, object], path: tuple, value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})  # type: ignore[assignment]
    tree[path[-1]] = value


def _cell(value) -> str:
    text = "-" if value is None else str(value)
    # One printable line per row, whatever a host file held.
    text = "".join(c if c.isprintable() or c.isspace() else "?" for c in text)
    return " ".join(text.split()) or "-"


def _layout(header: List[str], rows: List[List[str]]) -> str:
    table = [header] + rows
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)
