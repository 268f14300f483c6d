"""The per-step cost of handing a step's inputs from rank 0 to a tensor-parallel worker.

Two ranks on a CPU (gloo, one torch thread each). For a decode step of 64 sequences (1,000
tokens of context each, block size 16) and a prefill of 2,048 tokens (4 prompts of 512), rank 0
builds the ``StepInputs`` and hands them over by each transport; the worker then joins a
one-element all-reduce, which stands for the step's first collective. Reported: the median
µs of that, minus the median of the all-reduce alone (so: send, receive, unpickle).

    socket               one pickled frame over a socket pair, the tensors as numpy arrays
                         (``messages.Step``: what ``MultiprocExecutor`` does)
    socket_torch_pickle  the same with the torch tensors pickled as they are
    broadcast_object   as torch.distributed.broadcast_object_list does it on the gloo group:
                       the pickle's length, then its bytes, by two broadcasts
    broadcast_tensors  the rest pickled (as broadcast_object), then one broadcast per tensor

(broadcast_object_list itself wants a group registered in the default world; the executor's
group is not, so its two broadcasts are made here on the group directly.)

    .venv/bin/python benchmarks/executor_transport.py
"""

import multiprocessing
import pickle
import socket
import statistics
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from kvserve.engine.executor import messages
from kvserve.engine.executor.distributed import free_port, process_group, rendezvous_store
from kvserve.engine.executor.model_runner import StepInputs
from kvserve.engine.layers.attention.metadata import AttentionMetadata

REPEATS = 300
TRANSPORTS = ("socket", "socket_torch_pickle", "broadcast_object", "broadcast_tensors")
TENSORS = ("input_ids", "positions", "logits_indices")
META_TENSORS = ("slot_mapping", "query_start_loc", "seq_lens", "block_tables")


def step_inputs(query_lens: list[int], seq_lens: list[int], block_size: int = 16) -> StepInputs:
    """A step's inputs as ``ModelRunner.prepare`` lays them out."""
    rows = sum(query_lens)
    blocks = -(-max(seq_lens) // block_size)
    ends = np.cumsum(query_lens)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(rows, dtype=torch.int64),
        query_start_loc=torch.tensor([0, *ends], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.arange(len(seq_lens) * blocks, dtype=torch.int32).view(-1, blocks),
        query_lens_host=query_lens,
        seq_lens_host=seq_lens,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )
    return StepInputs(
        input_ids=torch.randint(0, 32000, (rows,)),
        positions=torch.arange(rows),
        meta=meta,
        logits_indices=torch.tensor(ends - 1),
        every_row=rows == len(query_lens),
    )


SHAPES = {
    "decode, 64 sequences": step_inputs([1] * 64, [1000] * 64),
    "prefill, 2048 tokens": step_inputs([512] * 4, [512] * 4),
}


def tensors_of(inputs: StepInputs) -> list[torch.Tensor]:
    return [getattr(inputs, n) for n in TENSORS] + [getattr(inputs.meta, n) for n in META_TENSORS]


def hand_over(how: str, rank: int, group, sock: socket.socket, inputs: StepInputs | None):
    """Rank 0 gives ``inputs``; rank 1 gets them back."""
    if how == "socket":
        if rank == 0:
            sock.sendall(messages.frame(messages.Step.of(inputs)))
            return inputs
        step = messages.receive(sock)
        assert isinstance(step, messages.Step)
        return step.unpack()
    if how == "socket_torch_pickle":
        if rank == 0:
            sock.sendall(messages.frame(inputs))
            return inputs
        return messages.receive(sock)
    if how == "broadcast_object":
        return broadcast_object(inputs, group)
    # broadcast_tensors: the metadata without its tensors, then each tensor
    shell = None
    if rank == 0:
        assert inputs is not None
        shapes = [(t.shape, t.dtype) for t in tensors_of(inputs)]
        host = inputs.meta
        shell = (shapes, host.query_lens_host, host.seq_lens_host, inputs.every_row)
    shapes, _, _, _ = broadcast_object(shell, group)
    if inputs is not None:
        parts = tensors_of(inputs)
    else:
        parts = [torch.empty(shape, dtype=dtype) for shape, dtype in shapes]
    for tensor in parts:
        broadcast(tensor, group)
    return parts


def broadcast(tensor: torch.Tensor, group) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


def broadcast_object(value, group):
    """``value`` from rank 0 (None elsewhere), pickled: its length, then its bytes."""
    length = torch.zeros(1, dtype=torch.int64)
    data = None
    if value is not None:
        data = torch.frombuffer(bytearray(pickle.dumps(value, protocol=5)), dtype=torch.uint8)
        length[0] = data.numel()
    broadcast(length, group)
    if data is None:
        data = torch.empty(int(length[0]), dtype=torch.uint8)
    broadcast(data, group)
    return pickle.loads(data.numpy().tobytes()) if value is None else value


def run_rank(rank: int, port: int, sock: socket.socket, results) -> None:
    torch.set_num_threads(1)
    timeout = timedelta(seconds=60)
    store = rendezvous_store(port, rank, 2, timeout)
    group = process_group(store, rank, 2, torch.device("cpu"), timeout)
    one = torch.zeros(1)
    for name, inputs in SHAPES.items():
        for how in ("all_reduce", *TRANSPORTS):
            times = []
            for _ in range(REPEATS):
                dist.all_reduce(one, group=group)  # both ranks start together
                start = time.perf_counter()
                if how != "all_reduce":
                    hand_over(how, rank, group, sock, inputs if rank == 0 else None)
                dist.all_reduce(one, group=group)
                times.append(time.perf_counter() - start)
            if rank == 0:
                results[(name, how)] = statistics.median(times) * 1e6


def main() -> None:
    port = free_port()
    ours, theirs = socket.socketpair()
    context = multiprocessing.get_context("spawn")
    worker = context.Process(target=run_rank, args=(1, port, theirs, {}))
    worker.start()
    results: dict = {}
    run_rank(0, port, ours, results)
    worker.join()
    print(f"{'step':22} " + " ".join(f"{t:>20}" for t in TRANSPORTS) + "   (µs per step)")
    for name in SHAPES:
        base = results[(name, "all_reduce")]
        cells = " ".join(f"{results[(name, t)] - base:20.0f}" for t in TRANSPORTS)
        print(f"{name:22} {cells}")
    print(f"(a one-element all-reduce alone: {base:.0f} µs)")


if __name__ == "__main__":
    main()
