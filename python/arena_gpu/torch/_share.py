"""One host copy of an image's streamed blocks for the processes of a host
under torch.distributed (``attach(..., share_host=, group=)``): one process
per host opens the image first and loads the host copies into memory the
host's processes share; after a barrier of the group the others open it and
map those pages (the library's ARENA_OPEN_SHARE_HOST; docs/SHARING.md)."""

from __future__ import annotations

import socket
from typing import Any, Callable, List, Optional, Tuple

from .. import Arena, Error


def _host_id() -> str:
    """This host, as the processes on it see it: its name and the kernel's boot id
    (two containers of one name on different machines differ by it)."""
    boot = ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        pass
    return f"{socket.gethostname()}/{boot}"


def _distributed() -> Any:
    """torch.distributed when a process group is initialized, else None."""
    try:
        import torch.distributed as dist
    except ImportError:  # a torch built without it
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def local_ranks(group: Any = None) -> Tuple[int, int]:
    """This process's place among the processes of ``group`` (None: the default
    group) that run on this host, and how many there are: (0, 1) without
    torch.distributed. A collective of the group: all its processes call it.

    Found with the group's own ``all_gather_object`` of a host identity (its name
    and boot id), so any group works, not only one laid out as torchrun's
    LOCAL_RANK says."""
    dist = _distributed()
    if dist is None:
        return 0, 1
    me = dist.get_rank(group)
    if me < 0:
        raise Error("USAGE", "attach: this process is not a member of the group given (group=)")
    ids: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(ids, _host_id(), group=group)
    mine = [r for r, h in enumerate(ids) if h == ids[me]]
    return mine.index(me), len(mine)


def open_shared(open_fn: Callable[[bool], Arena], share_host: Optional[bool], group: Any) -> Arena:
    """Open through ``open_fn(share)``, one loader per host first when sharing.

    share_host None: share when torch.distributed is initialized and the group has
    more than one process on this host. Under torch.distributed every process of
    the group must call it (it gathers and waits on the group's barrier); a
    loader's failure is raised after the barrier, so the others never wait for
    it (they open the image themselves)."""
    dist = _distributed()
    if dist is None:
        if group is not None:
            raise Error("USAGE", "attach: group= given, but torch.distributed is not initialized "
                                 "(call torch.distributed.init_process_group first)")
        return open_fn(bool(share_host))
    local, count = local_ranks(group)
    share = count > 1 if share_host is None else bool(share_host)
    if not share:
        return open_fn(False)
    a: Optional[Arena] = None
    err: Optional[BaseException] = None
    if local == 0:  # the host's loader: the others map what it loads
        try:
            a = open_fn(True)
        except BaseException as e:  # raised once the others are past the barrier
            err = e
    dist.barrier(group=group)
    if err is not None:
        raise err
    if a is None:
        a = open_fn(True)
    return a
