def size(
    values: list[object] | tuple[object, ...], limit: int, leaves: tuple[type, ...], /
) -> int: ...
def numbers(values: list[object] | tuple[object, ...], /) -> int: ...
def plan(
    block: list[object] | tuple[object, ...],
    is_map: bool,
    limit: int,
    leaves: tuple[type, ...],
    sizes: tuple[int, ...] | None,
    /,
) -> tuple[list[tuple[int, int, int] | tuple[int, int, int, tuple[int, ...]]], bool]: ...
