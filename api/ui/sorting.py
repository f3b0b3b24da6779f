"""Sortable tables, without JavaScript: `?sort=COLUMN` sorts ascending, `?sort=-COLUMN`
descending, COLUMN one of the page's whitelist; anything else is refused with the accepted
values (InvalidInput: the 422 error page every bad parameter gets).

Column headers are links. A column's first click sorts the way a reader usually wants it first
(newest, most versions, lowest loss), the next click reverses it; the sorted column's header
carries aria-sort and an arrow. Links are relative (`?...`, as pages.next_page's) and drop the
cursor: a cursor belongs to the order it was made in.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from ...zoo.errors import InvalidInput

ASC, DESC = "ascending", "descending"


@dataclass(frozen=True)
class Sorts:
    first: dict[str, str]       # column -> ASC or DESC: the order of its header's first click
    default: str                # the order a page without ?sort= shows, e.g. "name", "-version"
    anchor: str = ""            # "#versions": a re-sorted page opens at its table

    @property
    def accepted(self) -> list[str]:
        return [s for column in self.first for s in (column, f"-{column}")]

    def parse(self, sort: str | None) -> str:
        """The sort asked for (empty: the default). Raises InvalidInput naming the accepted."""
        if not sort:
            return self.default
        if sort not in self.accepted:
            shown = sort if len(sort) <= 40 else sort[:40] + "..."
            raise InvalidInput(f"sort {shown!r} is not one of {', '.join(self.accepted)} "
                               "(a leading - sorts descending)")
        return sort

    def headers(self, request: Request, sort: str) -> dict[str, dict]:
        """column -> its header link: href, order (ASC, DESC or None: not the sorted column)
        and next (the order the link sorts in)."""
        column, descending = sort.lstrip("-"), sort.startswith("-")
        out = {}
        for name, first in self.first.items():
            order = (DESC if descending else ASC) if name == column else None
            if order is None:           # another column: the order of its first click
                target = name if first == ASC else f"-{name}"
            else:                       # the sorted column: the other order
                target = f"-{name}" if order == ASC else name
            url = request.url.remove_query_params(["cursor", "sort"])
            if target != self.default:      # the default order's address stays the plain one
                url = url.include_query_params(sort=target)
            out[name] = {"href": f"?{url.query}{self.anchor}", "order": order,
                         "next": DESC if target.startswith("-") else ASC}
        return out
