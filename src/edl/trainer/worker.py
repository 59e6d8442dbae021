"""``edl trainer``: one elastic PaddlePaddle data-parallel worker.

The loop, per generation: get the assignment from the master, form the
collective in-process, take model state from rank 0 (its replica, the
checkpoint, or a fresh seeded init), then step. Each step's all-reduce carries
the gradients *and* one slot per rank with its data cursor, sample count, loss
sum and two flags (stop, finished). So every rank that completes a step knows
every rank's position at that step, and all ranks agree, through the collective
itself, on the step at which a generation ends.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import tempfile
import threading
import time
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np
import paddle

from edl.data.dataset import Dataset
from edl.errors import CollectiveError, EdlError, StaleError, TemporaryError, UserError
from edl.api.data import Cursor, Task
from edl.api.master import Assignment, JobStatus, Next, Source, SyncReport, Unassigned
from edl.modeldef import ModelDef, load_model_def
from edl.storage.checkpoint import FINAL, WARM_START_FILE, AsyncCheckpointWriter, Checkpoint, CheckpointStore, WriteJob, decode_arrays, encode_arrays
from edl.storage.store import open_store
from edl.trainer import state as mstate
from edl.trainer.audit import AuditLog
from edl.master.client import HttpMaster
from edl.net import free_port
from edl.trainer.collective import Group
from edl.trainer.data import TaskBuffer, read_slices
from edl.trainer.slots import COUNT, FINISHED, LOSS, SLOT, STOP, decode_cursor, encode_slot

log = logging.getLogger("edl.trainer")
T = TypeVar("T")

EXIT_OK, EXIT_FAILED, EXIT_USER, EXIT_EXCLUDED = 0, 1, 2, 3
COLLECTIVE_HANG_S = 15.0  # stuck this long while the master has moved on: give up
COLLECTIVE_DEADLINE_S = float(os.environ.get("EDL_COLLECTIVE_DEADLINE_S", "300"))  # stuck this long: give up


@dataclass
class Control:
    """What the heartbeat thread learned, read by the training loop at step boundaries."""

    stop_generation: int = -1  # stop at the next boundary if in this generation
    master_uid: str | None = None
    master_changed: bool = False
    job_done: bool = False
    checkpoint_now: bool = False  # the master asks for a checkpoint at the next step (rank 0)


class Trainer:
    def __init__(self, trainer_id: str, master: str, token: str, host: str, audit_dir: Path | None,
                 backend: str = "gloo") -> None:
        self.id = trainer_id
        self.last_loss: float | None = None
        self._init_params: dict[str, np.ndarray] | None = None
        self.master_addr = master
        self.token = token
        self.host = host
        self.backend = backend
        self.client = HttpMaster(master, token)
        self.client_once = HttpMaster(master, token, give_up_s=0.0)  # for reports that may be lost
        self.spec = self.client.spec()
        self.md: ModelDef = load_model_def(self.spec.model_def)
        self._build()
        self.dataset = Dataset(self.spec.data)
        self.ckpts = CheckpointStore(open_store(self.spec.checkpoint_uri, "--checkpoint-uri"), self.spec.keep_checkpoints)
        self.buffer = TaskBuffer()
        self.ctl = Control()
        self.ctl_lock = threading.Lock()
        self.generation = 0
        self.step = 0
        self.safe_cursor: Cursor | None = None
        self.finished_tasks = False
        self.store_port = free_port(host)
        self.audit = AuditLog(audit_dir / f"{trainer_id}.jsonl") if (self.spec.audit and audit_dir) else None
        self.sample_input: np.ndarray | None = None
        self.writer: AsyncCheckpointWriter | None = None
        self._last_ckpt = time.monotonic()
        self._alive = True
        self._in_collective: float | None = None  # since when the main loop is inside a collective

    # ------------------------------------------------------------ model state
    def _build(self) -> None:
        paddle.seed(self.spec.seed)
        np.random.seed(self.spec.seed)
        self.model = self.md.model()
        self.opt = self.md.optimizer(self.model.parameters(), self.spec.learning_rate)
        if self.spec.init_model:
            self._warm_start()
        self.params = [p for p in self.model.parameters() if not p.stop_gradient]
        self.dirty = False

    def _warm_start(self) -> None:
        """Start from a previous model's parameters (its params.npz) instead of a seeded init."""
        if self._init_params is None:
            uri = self.spec.init_model
            try:
                self._init_params = decode_arrays(open_store(uri, "--init-model").get(WARM_START_FILE))
            except (OSError, ValueError, EdlError) as e:
                raise UserError(f"--init-model {uri!r}: cannot read {WARM_START_FILE}: {e}") from None
        try:
            mstate.restore(self.model, self.opt, self._init_params, {}, {})
        except ValueError as e:
            raise UserError(f"--init-model {self.spec.init_model!r}: the warm-start model does not match "
                            f"--model-def {self.spec.model_def}: {e}") from None

    # ------------------------------------------------------------ background
    @staticmethod
    def _background_call(call: Callable[[], T]) -> T | None:
        """One call from a background thread; on any failure wait a little and answer ``None``."""
        try:
            return call()
        except EdlError:
            time.sleep(0.2)
            return None

    def _take_checkpoint_request(self) -> bool:
        with self.ctl_lock:
            asked, self.ctl.checkpoint_now = self.ctl.checkpoint_now, False
        return asked

    def _heartbeat_loop(self) -> None:
        client = HttpMaster(self.master_addr, self.token, timeout_s=10, give_up_s=0.0)
        while self._alive:
            r = self._background_call(lambda: client.heartbeat(
                self.id, generation=self.generation, step=self.step, safe_cursor=self.safe_cursor,
                loss=self.last_loss, wait_s=1.0))
            if r is None:
                continue
            since = self._in_collective
            stuck = time.monotonic() - since if since is not None else 0.0
            if stuck > COLLECTIVE_DEADLINE_S or (stuck > COLLECTIVE_HANG_S and r.generation != self.generation):
                # The master moved on while we are stuck in a collective that can no longer
                # complete (a peer vanished mid-rendezvous). Exit; the launcher replaces us.
                log.error("trainer %s stuck in generation %d for %.0f s; exiting", self.id, self.generation,
                          time.monotonic() - since)
                os._exit(EXIT_EXCLUDED)
            with self.ctl_lock:
                if self.ctl.master_uid is not None and r.master_uid != self.ctl.master_uid:
                    self.ctl.master_changed = True
                if r.stop:
                    self.ctl.stop_generation = r.generation
                if r.job_status is not JobStatus.RUNNING:
                    self.ctl.job_done = True
                self.ctl.checkpoint_now = r.checkpoint
            if not r.known:
                time.sleep(0.1)

    def _prefetch_loop(self) -> None:
        client = HttpMaster(self.master_addr, self.token, timeout_s=10, give_up_s=0.0)
        request_id = uuid.uuid4().hex
        while self._alive:
            if self.finished_tasks or self.buffer.remaining() >= 2 * self.spec.batch_size or self.generation == 0:
                time.sleep(0.01)
                continue
            r = self._background_call(lambda: client.next_task(self.id, request_id, self.safe_cursor))
            if r is None:
                continue  # same request id: a lost answer is handed out again, not twice
            request_id = uuid.uuid4().hex
            if isinstance(r, Task):
                self.buffer.add(r)
            elif r is Next.FINISHED:
                self.finished_tasks = True
            else:
                time.sleep(0.05)

    # ------------------------------------------------------------ main loop
    def _warm_up(self) -> None:
        """One forward/backward on real rows before registering, so that Paddle's first-call
        costs (kernel selection, allocations) are not paid inside the generation change."""
        shard = self.dataset.shards()[0]
        table = self.dataset.rows(shard.name, 0, min(shard.rows, self.spec.batch_size))
        x, y = self.md.collate(table)
        self.sample_input = x[:1]
        loss = self.md.loss(self.model(paddle.to_tensor(x)), paddle.to_tensor(y))
        loss.backward()
        self.opt.clear_grad()

    def run(self) -> int:
        self._warm_up()
        r = self.client.register(self.id, os.getpid(), self.host, self.store_port)
        self.ctl.master_uid = r.master_uid
        log.info("trainer %s registered with master %s", self.id, self.master_addr)
        threading.Thread(target=self._heartbeat_loop, name="edl-heartbeat", daemon=True).start()
        threading.Thread(target=self._prefetch_loop, name="edl-prefetch", daemon=True).start()
        try:
            while True:
                a = self.client.assignment(self.id, after=self.generation, wait_s=10.0)
                status = None if isinstance(a, Assignment) else a.why
                if status is Unassigned.WAIT:
                    continue
                if status is Unassigned.FINISHED:
                    return EXIT_OK if a.job_status is JobStatus.SUCCEEDED else EXIT_FAILED
                if status is Unassigned.LEFT:
                    log.info("trainer %s drained; leaving", self.id)
                    return EXIT_OK
                if status is Unassigned.FAILED:
                    log.warning("trainer %s was dropped from the job", self.id)
                    return EXIT_EXCLUDED
                if status is Unassigned.UNKNOWN:
                    self._reregister()
                    continue
                done = self._run_generation(a)
                if done:
                    return EXIT_OK
        finally:
            self._alive = False
            if self.writer is not None:
                self.writer.flush(60)

    def _reregister(self) -> None:
        """The master restarted and lost us: join it afresh."""
        self.store_port = free_port(self.host)
        self.generation = 0
        self.buffer.clear()
        self.finished_tasks = False
        r = self.client.register(self.id, os.getpid(), self.host, self.store_port)
        with self.ctl_lock:
            self.ctl = Control(master_uid=r.master_uid)
        log.info("trainer %s re-registered with restarted master", self.id)

    def _run_generation(self, a: Assignment) -> bool:
        gen, rank, world = a.generation, a.rank, a.world_size
        members = a.members
        key = (int(a.master_uid), gen)
        source = a.source
        if source is Source.PEER:
            self.buffer.reposition(a.cursor, list(a.held), a.held_offset)
        else:
            self.buffer.clear()
            self.finished_tasks = False
        self.generation = gen
        host, port = a.rendezvous
        t0 = time.monotonic()
        try:
            group_id = zlib.crc32(f"{a.master_uid}:{gen}".encode()) & 0x7FFFFFFF
            self._in_collective = time.monotonic()
            group = Group(host, port, rank, world, group_id, self.backend)
            if source is not Source.PEER and self.dirty:
                # Rolled back (to the checkpoint or to a fresh start): drop everything this replica
                # learned since, optimizer accumulators included, before taking rank 0's state.
                self._build()
            if source is Source.CHECKPOINT and rank == 0:
                self.step = self._load_checkpoint(a.checkpoint_uri)
            elif source is not Source.PEER:
                self.step = a.base_step
            t1 = time.monotonic()
            self.step = mstate.broadcast_state(group, self.model, self.opt, self.step if rank == 0 else a.base_step)
            t2 = time.monotonic()
        except CollectiveError as e:
            log.warning("trainer %s: generation %d did not form: %s", self.id, gen, e)
            self._report(gen, self.step, {}, failed=True)
            return False
        if self.audit:
            self.audit.generation(key, self.step)
        log.info("trainer %s: generation %d, rank %d of %d, step %d (group formed in %.3f s, state in %.3f s)",
                 self.id, gen, rank, world, self.step, t1 - t0, t2 - t1)
        if self.writer is None and rank == 0:
            self.writer = AsyncCheckpointWriter(self.ckpts, on_error=lambda m: log.warning("%s", m))
        cursors: dict[str, Cursor | None] = {m: None for m in members}
        if a.cursor is not None:
            cursors[self.id] = a.cursor
        first = True
        prev_own = self.buffer.cursor
        while True:
            n_rows = self.spec.batch_size
            slices = self.buffer.take(n_rows)
            finished = not slices and self.finished_tasks and self.buffer.remaining() == 0
            count, loss_sum = 0, 0.0
            if slices:
                try:
                    table = read_slices(self.dataset, slices)
                    x, y = self.md.collate(table)
                except UserError as e:
                    # Unreadable rows: give the task back (counted) and leave; the job retries it.
                    self.client.task_failed(self.id, slices[0].task.id, str(e))
                    raise
                count = len(y)
                if self.audit:
                    recs: dict[int, list[int]] = {}
                    for s in slices:
                        ids = self.dataset.rows(s.task.shard, s.start, s.end).column("id").to_pylist()
                        recs.setdefault(s.task.epoch, []).extend(ids)
                    self.audit.step(key, self.step + 1, recs)
                out = self.model(paddle.to_tensor(x))
                loss = self.md.loss(out, paddle.to_tensor(y))
                loss_sum = float(loss) * count
                (loss * count).backward()
            # Read the stop request as late as possible: it rides in this step's all-reduce.
            with self.ctl_lock:
                stop = self.ctl.stop_generation == gen or self.ctl.master_changed or self.ctl.job_done
            slots = np.zeros(world * SLOT, dtype=np.float32)
            slots[rank * SLOT : (rank + 1) * SLOT] = encode_slot(self.buffer.cursor, count, loss_sum, stop, finished)
            self._in_collective = time.monotonic()
            try:
                tail = self._all_reduce(group, slots).reshape(world, SLOT)
            except CollectiveError as e:
                log.warning("trainer %s: step %d failed: %s", self.id, self.step + 1, e)
                self._report(gen, self.step, cursors, failed=True)
                return False
            self._in_collective = None
            total = float(tail[:, COUNT].sum())
            total_loss = float(tail[:, LOSS].sum())
            if total > 0:
                if not math.isfinite(total_loss):
                    msg = f"loss is {total_loss} at step {self.step + 1}; stopping the job"
                    if rank == 0:
                        self.client.fail_job(msg)
                    raise SystemExit(EXIT_FAILED)
                self.last_loss = total_loss / total
                with paddle.no_grad():
                    for p in self.params:
                        p.grad.scale_(1.0 / total)  # summed per-sample gradients -> the mean
                self.opt.step()
                self.dirty = True
            self.opt.clear_grad()
            if total > 0:
                self.step += 1  # a round in which nobody had data leaves the model as it was
            # Cursors of every rank at this step; our own at the previous step is now safe
            # to commit (any rank finishing step s implies every rank finished s-1).
            self.safe_cursor = prev_own
            cursors = {m: decode_cursor(tail[i]) for i, m in enumerate(members)}
            prev_own = cursors[self.id]
            if first and rank == 0 and (total > 0 or tail[:, FINISHED].sum() >= world):
                first = False  # the generation's first completed training step ends its pause
                try:
                    self.client_once.first_step(self.id, gen)
                except TemporaryError:
                    pass  # the master is away: this generation's pause goes unmeasured
            if total == 0:
                time.sleep(0.02)  # nobody had data this step: don't spin
            if rank == 0 and (time.monotonic() - self._last_ckpt >= self.spec.checkpoint_interval_s
                              or self._take_checkpoint_request()):
                self._checkpoint(gen, cursors)
            if tail[:, FINISHED].sum() >= world:
                self.safe_cursor = prev_own
                if rank == 0:
                    self._finish(gen, cursors)
                return True
            if tail[:, STOP].sum() > 0:
                self._report(gen, self.step, cursors, failed=False)
                return False

    def _all_reduce(self, group: Group, slots: np.ndarray) -> np.ndarray:
        """Sum every gradient in place, then the slots, and return the summed slots.

        The slots go last: a rank that holds the summed slots of step s knows every
        gradient of s was summed too, so "committed" and "every cursor known" coincide.
        """
        for p in self.params:
            if p.grad is None:  # no data this step, or a parameter the batch did not touch
                p._set_grad_ivar(paddle.zeros(p.shape, p.dtype))
            group.all_reduce_sum(p.grad)
        t = paddle.to_tensor(slots)
        group.all_reduce_sum(t)
        return t.numpy()

    def _report(self, gen: int, step: int, cursors: dict[str, Cursor | None], failed: bool) -> None:
        self._in_collective = None
        self.store_port = free_port(self.host)  # a fresh port per generation: the old store may linger
        self.client.sync(SyncReport(self.id, gen, step, cursors, self.store_port, failed))

    # ------------------------------------------------------------ checkpoints
    def _checkpoint(self, gen: int, cursors: dict[str, Cursor | None], wait: bool = False) -> None:
        """Snapshot now (numpy copies); cut, serialise and upload on the writer thread."""
        self._last_ckpt = time.monotonic()
        params, opt_arrays, extra = mstate.snapshot(self.model, self.opt)
        step = self.step
        cut_cursors = dict(cursors)  # as of this step: the dict is read on the writer thread
        client = HttpMaster(self.master_addr, self.token, give_up_s=120)
        committed: list[Checkpoint] = []

        def build() -> dict[str, bytes]:
            try:
                cut = client.checkpoint_cut(gen, step, cut_cursors)
            except StaleError:
                raise StaleError("generation changed before the checkpoint was cut; skipped") from None
            trainer_meta = {"step": step, "opt_extra": extra, "model_def": self.spec.model_def}
            return {
                "model.npz": encode_arrays(params),
                "optimizer.npz": encode_arrays(opt_arrays),
                "trainer.json": json.dumps(trainer_meta, default=str).encode(),
                "master.json": json.dumps(cut).encode(),
            }

        def on_commit(ckpt: Checkpoint, seconds: float) -> None:
            committed.append(ckpt)
            client.checkpoint_committed(gen, step, ckpt.uri, seconds)
            log.info("trainer %s: checkpoint at step %d committed in %.2f s", self.id, step, seconds)

        assert self.writer is not None
        self.writer.submit(WriteJob(step, build, {"generation": gen}, on_commit))
        if wait:
            self.writer.flush(300)

    def _load_checkpoint(self, uri: str) -> int:
        name = uri.rstrip("/").rsplit("/", 1)[-1]
        ckpt, files = self.ckpts.read(name)
        meta = json.loads(files["trainer.json"])
        try:
            mstate.restore(self.model, self.opt, decode_arrays(files["model.npz"]),
                           decode_arrays(files["optimizer.npz"]), meta["opt_extra"])
        except ValueError as e:
            raise UserError(f"checkpoint {ckpt.uri} does not match --model-def {self.spec.model_def}: {e}") from e
        log.info("trainer %s: loaded %s (step %d)", self.id, ckpt.uri, ckpt.step)
        self.dirty = True
        return ckpt.step

    def _finish(self, gen: int, cursors: dict[str, Cursor | None]) -> None:
        self._checkpoint(gen, cursors, wait=True)
        final_uri = self._export()
        metrics = self._evaluate()
        outcome = {"step": self.step, "final_model_uri": final_uri, "metrics": metrics}
        self.ckpts.store.put(FINAL, json.dumps(outcome).encode())
        self.client.finish(self.step, final_uri, metrics)
        log.info("trainer %s: training finished at step %d; metrics %s", self.id, self.step, metrics)

    def _export(self) -> str | None:
        if self.sample_input is None:
            return None
        from paddle.static import InputSpec

        store = self.ckpts.store
        with tempfile.TemporaryDirectory() as tmp:
            prefix = Path(tmp) / "inference"
            self.model.eval()
            spec = [InputSpec([None, *self.sample_input.shape[1:]], str(self.sample_input.dtype), "x")]
            paddle.jit.save(self.model, str(prefix), input_spec=spec)
            self.model.train()
            for f in sorted(Path(tmp).iterdir()):
                store.put(f"model/{f.name}", f.read_bytes())
        # Parameters by structured name: what a later run warm-starts from (--init-model).
        params, _, _ = mstate.snapshot(self.model, self.opt)
        store.put(f"model/{WARM_START_FILE}", encode_arrays(params))
        return store.child("model")

    def _evaluate(self) -> dict[str, float]:
        if not self.spec.eval_data:
            return {}
        ds = Dataset(self.spec.eval_data, "--eval-data")
        table = ds.read_all()
        x, y = self.md.collate(table)
        self.model.eval()
        with paddle.no_grad():
            outs = [self.model(paddle.to_tensor(x[i : i + 1024])) for i in range(0, len(x), 1024)]
            out = paddle.concat(outs)
            loss = float(self.md.loss(out, paddle.to_tensor(y)))
        self.model.train()
        if self.md.metrics is not None:
            return {k: float(v) for k, v in self.md.metrics(out.numpy(), y).items()}
        result = {"loss": loss}
        o = out.numpy()
        if o.ndim == 2 and y.ndim == 1 and np.issubdtype(y.dtype, np.integer):
            result["accuracy"] = float((o.argmax(axis=1) == y).mean())
        return result


def run_trainer(trainer_id: str, master: str, token: str, audit_dir: str | None, backend: str) -> int:
    host = os.environ.get("EDL_TRAINER_HOST") or socket.gethostbyname(socket.gethostname())
    if master.startswith(("127.", "localhost", "http://127.", "http://localhost")):
        host = "127.0.0.1"
    try:
        trainer = Trainer(trainer_id, master, token, host, Path(audit_dir) if audit_dir else None, backend)
    except UserError as e:
        # Tell the master so the job fails with the reason, not just an exit code.
        try:
            HttpMaster(master, token, give_up_s=0.0).fail_job(str(e))
        except TemporaryError:
            pass  # the master is away: the launcher still sees the exit code
        raise
    return trainer.run()
