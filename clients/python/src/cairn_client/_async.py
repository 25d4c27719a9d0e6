"""The asyncio client: `AsyncClient`, the surface of `Client` on grpc.aio (awaitables, async
iterators, `async with` sessions)."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
)
from types import TracebackType
from typing import (
    IO,
    TYPE_CHECKING,
    Literal,
    TypeVar,
    cast,
    overload,
)

import grpc
from google.protobuf.message import Message

from . import _requests as rq
from ._config import Options, PathLike, Settings, open_aio_channel
from ._errors import CairnError, from_rpc_error
from ._pb.cairn.v1 import artifact_store_pb2 as store_pb
from ._pb.cairn.v1 import common_pb2 as common_pb
from ._pb.cairn.v1 import ingest_pb2 as ingest_pb
from ._pb.cairn.v1 import orchestrator_pb2 as orch_pb
from ._pb.cairn.v1 import sandbox_pb2 as sandbox_pb
from ._types import (
    FINAL_STATES,
    Event,
    ExecResult,
    FileInfo,
    GrepMatch,
    Identity,
    LogChunk,
    Manifest,
    Note,
    PackSummary,
    Project,
    PutResult,
    Run,
    RunnerInfo,
    RunResult,
    TaskState,
)

if TYPE_CHECKING:
    from ._config import Unpack

Q = TypeVar("Q", bound=Message)
R = TypeVar("R", bound=Message)
T = TypeVar("T")
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


class _Conn:
    """Channels (one per distinct address) and the calls: deadlines, bearer metadata, retries
    after UNAVAILABLE, streams that reconnect and resume."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._channels: dict[str, grpc.aio.Channel] = {}

    def channel(self, service: str) -> grpc.aio.Channel:
        address = self.settings.address(service)
        if address not in self._channels:
            self._channels[address] = open_aio_channel(self.settings, address)
        return self._channels[address]

    def project(self, project: str | None) -> str:
        return project or self.settings.project

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()

    async def unary(
        self, rpc: rq.Rpc[Q, R], request: Q, *, timeout: float | None = None, retry: bool = True
    ) -> R:
        call = self.channel(rpc.service).unary_unary(
            rpc.path, request_serializer=rq.serialize, response_deserializer=rpc.response.FromString
        )
        return cast(
            R,
            await self._retrying(
                lambda: call(
                    request,
                    timeout=timeout or self.settings.timeout,
                    metadata=self.settings.metadata(),
                ),
                retry,
            ),
        )

    async def upload(
        self,
        rpc: rq.Rpc[Q, R],
        requests: Callable[[], Iterator[Q] | AsyncIterator[Q]],
        *,
        replayable: bool,
    ) -> R:
        call = self.channel(rpc.service).stream_unary(
            rpc.path, request_serializer=rq.serialize, response_deserializer=rpc.response.FromString
        )
        return cast(
            R,
            await self._retrying(
                lambda: call(
                    requests(),
                    timeout=self.settings.transfer_timeout,
                    metadata=self.settings.metadata(),
                ),
                replayable,
            ),
        )

    async def _retrying(self, attempt: Callable[[], Awaitable[object]], retry: bool) -> object:
        """`attempt()`'s answer; after UNAVAILABLE, when `retry`, tried again with backoff."""
        policy = self.settings.retry
        tried = 0
        while True:
            tried += 1
            try:
                return await attempt()
            except grpc.RpcError as e:
                err = from_rpc_error(e)
            if not (retry and err.code == UNAVAILABLE and tried < policy.attempts):
                raise err
            await asyncio.sleep(policy.delay(tried, err))

    async def follow(
        self,
        rpc: rq.Rpc[Q, R],
        request: Callable[[], Q],
        accept: Callable[[R], T | None],
        *,
        timeout: float | None = None,
        resume: bool = True,
    ) -> AsyncIterator[T]:
        """The stream's items that `accept` keeps. After UNAVAILABLE (the service went away) it
        calls again with `request()` (built from what was delivered) for up to
        retry.reconnect_for seconds, unless `resume` is off; `timeout` bounds the whole stream."""
        method = self.channel(rpc.service).unary_stream(
            rpc.path, request_serializer=rq.serialize, response_deserializer=rpc.response.FromString
        )
        policy = self.settings.retry
        end = None if timeout is None else time.monotonic() + timeout
        lost_since: float | None = None
        attempt = 0
        while True:
            left = None if end is None else max(end - time.monotonic(), 0.001)
            call = method(request(), timeout=left, metadata=self.settings.metadata())
            try:
                async for message in call:
                    lost_since, attempt = None, 0
                    item = accept(cast(R, message))
                    if item is not None:
                        yield item
                return
            except grpc.RpcError as e:
                err = from_rpc_error(e)
            finally:
                call.cancel()
            now = time.monotonic()
            lost_since = lost_since or now
            attempt += 1
            if (
                not resume
                or err.code != UNAVAILABLE
                or now - lost_since >= policy.reconnect_for
                or (end is not None and now >= end)
            ):
                raise err
            await asyncio.sleep(policy.delay(attempt, err))


class Runs:
    """Runs of the orchestrator: submit, inspect, follow, and the human actions."""

    def __init__(self, conn: _Conn) -> None:
        self._c = conn

    async def submit(
        self,
        graph: PathLike | Mapping[str, object] | None = None,
        *,
        vars: Mapping[str, str] | None = None,
        project: str | None = None,
        request_id: str | None = None,
        run_id: str | None = None,
        title: str = "",
        mode: str = "",
        prompt: str = "",
        llm: str = "",
        files: Mapping[str, bytes] | None = None,
        graph_dir: str = "",
    ) -> Run:
        """Starts a run of `graph` (a YAML file's path, or the graph as a dict). Give
        `request_id` to make resubmitting safe; one is made when neither it nor run_id is."""
        req = rq.submit_request(
            self._c.project(project),
            graph,
            vars=vars,
            request_id=request_id,
            run_id=run_id,
            title=title,
            mode=mode,
            prompt=prompt,
            llm=llm,
            files=files,
            graph_dir=graph_dir,
        )
        return Run._from(await self._c.unary(rq.SUBMIT, req, retry=bool(req.request_id)))

    async def rerun(
        self,
        run: rq.RunRef,
        *,
        vars: Mapping[str, str] | None = None,
        title: str = "",
        llm: str = "",
        request_id: str | None = None,
        project: str | None = None,
    ) -> Run:
        """A new run from `run`'s records (graph, variables, title, LLM; given ones replace)."""
        req = rq.submit_request(
            self._c.project(project),
            None,
            vars=vars,
            request_id=request_id,
            run_id=None,
            title=title,
            mode="",
            prompt="",
            llm=llm,
            files=None,
            graph_dir="",
            rerun_of=rq.run_id(run),
        )
        return Run._from(await self._c.unary(rq.SUBMIT, req))

    async def get(self, run: rq.RunRef, *, project: str | None = None) -> Run:
        req = orch_pb.GetRunRequest(project_id=self._c.project(project), run_id=rq.run_id(run))
        return Run._from(await self._c.unary(rq.GET_RUN, req))

    async def list(
        self,
        *,
        project: str | None = None,
        states: Iterable[TaskState] | None = None,
        search: str = "",
        since: rq.Time | None = None,
        until: rq.Time | None = None,
        stalled: bool = False,
        page_size: int = 0,
    ) -> AsyncIterator[Run]:
        """Runs newest first, fetched a page at a time; `search` matches title, goal or id,
        `since`/`until` bound the creation time."""
        token = ""
        while True:
            req = rq.list_runs_request(
                self._c.project(project),
                states=states,
                search=search,
                since=since,
                until=until,
                stalled=stalled,
                page_size=page_size,
                page_token=token,
            )
            page = await self._c.unary(rq.LIST_RUNS, req)
            for info in page.runs:
                yield Run._from(info)
            token = page.next_page_token
            if not token:
                return

    def watch(
        self,
        run: rq.RunRef,
        *,
        from_seq: int = 1,
        follow: bool = False,
        project: str | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[Event]:
        """The run's events from `from_seq`, live, until the run ends (with `follow`, on through
        resume and rework until you stop iterating). A lost connection is resumed after the last
        event delivered: no event is skipped or repeated."""
        cursor = rq.EventCursor(from_seq)
        project_id, rid = self._c.project(project), rq.run_id(run)
        return self._c.follow(
            rq.WATCH_RUN,
            lambda: orch_pb.WatchRunRequest(
                project_id=project_id, run_id=rid, from_seq=cursor.next_seq, follow_after_end=follow
            ),
            cursor.accept,
            timeout=timeout,
        )

    async def wait(
        self,
        run: rq.RunRef,
        *,
        until: Iterable[TaskState] = FINAL_STATES,
        project: str | None = None,
        timeout: float | None = None,
    ) -> Run:
        """Blocks until the run is in one of the `until` states (default: ended) and returns
        it; TimeoutError after `timeout` seconds."""
        wanted = frozenset(until)
        info = await self.get(run, project=project)
        if info.state in wanted:
            return info
        try:
            async for event in self.watch(run, follow=True, project=project, timeout=timeout):
                if rq.state_may_change(event):
                    info = await self.get(run, project=project)
                    if info.state in wanted:
                        return info
        except CairnError as e:
            if e.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(
                    f"run {info.run_id} is still {info.state.name} after {timeout} s"
                ) from None
            raise
        return await self.get(run, project=project)

    async def _action(
        self,
        rpc: rq.Rpc[orch_pb.RunActionRequest, orch_pb.RunInfo],
        run: rq.RunRef,
        reason: str,
        by: str,
        project: str | None,
    ) -> Run:
        req = orch_pb.RunActionRequest(
            project_id=self._c.project(project), run_id=rq.run_id(run), by=rq.who(by), reason=reason
        )
        return Run._from(await self._c.unary(rpc, req))

    async def cancel(
        self, run: rq.RunRef, *, reason: str = "", by: str = "", project: str | None = None
    ) -> Run:
        return await self._action(rq.CANCEL, run, reason, by, project)

    async def resume(
        self, run: rq.RunRef, *, reason: str = "", by: str = "", project: str | None = None
    ) -> Run:
        return await self._action(rq.RESUME, run, reason, by, project)

    async def _decide(
        self,
        rpc: rq.Rpc[orch_pb.GateDecisionRequest, orch_pb.RunInfo],
        run: rq.RunRef,
        gate: str | None,
        note: str,
        by: str,
        project: str | None,
    ) -> Run:
        gate_id = gate or rq.blocked_gate(await self.get(run, project=project))
        req = orch_pb.GateDecisionRequest(
            project_id=self._c.project(project),
            run_id=rq.run_id(run),
            gate_id=gate_id,
            by=rq.who(by),
            note=note,
        )
        return Run._from(await self._c.unary(rpc, req))

    async def approve(
        self,
        run: rq.RunRef,
        gate: str | None = None,
        *,
        note: str = "",
        by: str = "",
        project: str | None = None,
    ) -> Run:
        """Approves `gate` (default: the run's one blocked gate)."""
        return await self._decide(rq.APPROVE, run, gate, note, by, project)

    async def reject(
        self,
        run: rq.RunRef,
        gate: str | None = None,
        *,
        note: str = "",
        by: str = "",
        project: str | None = None,
    ) -> Run:
        """Rejects `gate` (default: the run's one blocked gate) with a note."""
        return await self._decide(rq.REJECT, run, gate, note, by, project)

    async def note(
        self, run: rq.RunRef, text: str, *, by: str = "", project: str | None = None
    ) -> Note:
        """Appends a note for later agent nodes to shared/human-notes.md."""
        req = orch_pb.AddNoteRequest(
            project_id=self._c.project(project), run_id=rq.run_id(run), by=rq.who(by), text=text
        )
        r = await self._c.unary(rq.ADD_NOTE, req)
        return Note(r.seq, r.ref)

    async def rework(
        self, run: rq.RunRef, node: str, *, note: str = "", by: str = "", project: str | None = None
    ) -> Run:
        """Redoes `node` and everything that depends on it."""
        req = orch_pb.ReworkRequest(
            project_id=self._c.project(project),
            run_id=rq.run_id(run),
            node_id=node,
            by=rq.who(by),
            note=note,
        )
        return Run._from(await self._c.unary(rq.REWORK, req))

    async def edit_context(
        self, run: rq.RunRef, manifest_yaml: str, *, by: str = "", project: str | None = None
    ) -> int:
        """Replaces shared/context-manifest.yaml; returns the event's seq."""
        req = orch_pb.EditContextRequest(
            project_id=self._c.project(project),
            run_id=rq.run_id(run),
            by=rq.who(by),
            manifest_yaml=manifest_yaml,
        )
        return (await self._c.unary(rq.EDIT_CONTEXT, req)).seq

    def logs(
        self,
        run: rq.RunRef,
        *,
        node: str = "",
        follow: bool = True,
        project: str | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[LogChunk]:
        """What the run's nodes print, as it comes (with `follow`, until the run ends); resumed
        after a lost connection without repeating a chunk."""
        cursor = rq.LogCursor()
        project_id, rid = self._c.project(project), rq.run_id(run)
        return self._c.follow(
            rq.WATCH_LOGS,
            lambda: cursor.request(project_id, rid, node, follow),
            cursor.accept,
            timeout=timeout,
        )

    async def whoami(self) -> Identity:
        r = await self._c.unary(rq.WHOAMI, orch_pb.WhoAmIRequest())
        return Identity(r.name, r.role, tuple(r.projects), r.tokens_required)


class Store:
    """Project files of the artifact-store, streamed in chunks with their sha256."""

    def __init__(self, conn: _Conn) -> None:
        self._c = conn

    async def put(
        self,
        path: str,
        data: rq.Source | AsyncIterable[bytes],
        *,
        overwrite: bool = False,
        project: str | None = None,
        create_project: bool = True,
        chunk_size: int = rq.CHUNK,
    ) -> PutResult:
        """Writes `data` (bytes, a local file's path, a binary file, an iterable or an async
        iterable of chunks) to `path`; the store checks its sha256 before publishing it."""
        header = store_pb.PutHeader(
            project_id=self._c.project(project),
            path=path,
            overwrite=overwrite,
            create_project=create_project,
        )
        if isinstance(data, AsyncIterable):
            sent = rq.Upload((), chunk_size)  # no digest ahead: hashed as sent, checked after
            reply = await self._c.upload(
                rq.PUT, lambda: _async_requests(header, data, sent), replayable=False
            )
            sent.check(reply.digest.sha256)
            return PutResult._from(reply)
        upload = rq.Upload(data, chunk_size)
        reply = await self._c.upload(
            rq.PUT, lambda: upload.requests(header), replayable=upload.replayable
        )
        upload.check(reply.digest.sha256)
        return PutResult._from(reply)

    async def _get_into(
        self, path: str, sink: IO[bytes], offset: int, length: int, project: str | None
    ) -> FileInfo:
        download = rq.Download(sink)
        project_id = self._c.project(project)

        def request() -> store_pb.GetRequest:
            # A resumed download asks for what it has not received yet.
            done = download.size
            return store_pb.GetRequest(
                project_id=project_id,
                path=path,
                offset=offset + done,
                length=max(length - done, 0) if length else 0,
            )

        def accept(m: store_pb.GetResponse) -> None:
            download.take(m)

        async for _ in self._c.follow(
            rq.GET, request, accept, timeout=self._c.settings.transfer_timeout
        ):
            pass
        return download.finish(whole=offset == 0 and length == 0)

    @overload
    async def get(
        self,
        path: str,
        *,
        to: None = None,
        offset: int = 0,
        length: int = 0,
        project: str | None = None,
    ) -> bytes: ...

    @overload
    async def get(
        self,
        path: str,
        *,
        to: PathLike | IO[bytes],
        offset: int = 0,
        length: int = 0,
        project: str | None = None,
    ) -> FileInfo: ...

    async def get(
        self,
        path: str,
        *,
        to: PathLike | IO[bytes] | None = None,
        offset: int = 0,
        length: int = 0,
        project: str | None = None,
    ) -> bytes | FileInfo:
        """The file's bytes, or with `to` (a local path or a binary file) its FileInfo after
        streaming it there; `offset`/`length` read a range."""
        if to is None:
            buffer = io.BytesIO()
            await self._get_into(path, buffer, offset, length, project)
            return buffer.getvalue()
        if hasattr(to, "write"):
            return await self._get_into(path, cast(IO[bytes], to), offset, length, project)
        sink = rq.FileSink(to)
        try:
            info = await self._get_into(path, sink.file, offset, length, project)
        except BaseException:
            sink.abort()
            raise
        sink.commit()
        return info

    async def stat(
        self, path: str, *, sha256: bool = False, project: str | None = None
    ) -> FileInfo:
        req = store_pb.StatRequest(
            project_id=self._c.project(project), path=path, include_sha256=sha256
        )
        return FileInfo._from(await self._c.unary(rq.STAT, req))

    async def ls(
        self,
        prefix: str = "",
        *,
        recursive: bool = False,
        project: str | None = None,
        page_size: int = 0,
    ) -> AsyncIterator[FileInfo]:
        """Entries under `prefix`, a page at a time."""
        token = ""
        while True:
            req = store_pb.ListRequest(
                project_id=self._c.project(project),
                prefix=prefix,
                recursive=recursive,
                page=common_pb.PageRequest(page_size=page_size, page_token=token),
            )
            page = await self._c.unary(rq.LIST, req)
            for entry in page.entries:
                yield FileInfo._from(entry)
            token = page.next_page_token
            if not token:
                return

    async def delete(self, path: str, *, project: str | None = None) -> bool:
        req = store_pb.DeleteRequest(project_id=self._c.project(project), path=path)
        return (await self._c.unary(rq.DELETE, req)).deleted

    def events(
        self,
        run: rq.RunRef,
        *,
        from_seq: int = 1,
        follow: bool = False,
        limit: int = 0,
        project: str | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[Event]:
        """The run's stored events (events.jsonl) from `from_seq`; with `follow`, new ones as
        they are appended. Resumed after a lost connection without gaps or repeats."""
        cursor = rq.EventCursor(from_seq)
        project_id, rid = self._c.project(project), rq.run_id(run)
        return self._c.follow(
            rq.READ_EVENTS,
            lambda: store_pb.ReadEventsRequest(
                project_id=project_id,
                run_id=rid,
                from_seq=cursor.next_seq,
                follow=follow,
                limit=max(limit - (cursor.next_seq - max(from_seq, 1)), 0) if limit else 0,
            ),
            cursor.accept,
            timeout=timeout,
        )

    async def create_project(self, project: str) -> Project:
        r = await self._c.unary(
            rq.CREATE_PROJECT, store_pb.CreateProjectRequest(project_id=project)
        )
        return Project(r.project_id, r.created_at)

    async def projects(self) -> AsyncIterator[Project]:
        token = ""
        while True:
            req = store_pb.ListProjectsRequest(page=common_pb.PageRequest(page_token=token))
            page = await self._c.unary(rq.LIST_PROJECTS, req)
            for p in page.projects:
                yield Project(p.project_id, p.created_at)
            token = page.next_page_token
            if not token:
                return


async def _async_requests(
    header: store_pb.PutHeader, data: AsyncIterable[bytes], sent: rq.Upload
) -> AsyncIterator[store_pb.PutRequest]:
    """The Put messages of an async source, hashed as they go (checked against the reply)."""
    header.ClearField("expected_sha256")
    yield store_pb.PutRequest(header=header)
    async for chunk in data:
        for i in range(0, len(chunk), sent.chunk_size):
            piece = bytes(chunk[i : i + sent.chunk_size])
            sent.sent.update(piece)
            yield store_pb.PutRequest(chunk=piece)


class Session:
    """A sandbox session (one container with /workspace), closed when the `async with` block ends."""

    def __init__(self, conn: _Conn, request: sandbox_pb.OpenSessionRequest) -> None:
        self._c = conn
        self._request = request
        self.id = ""
        self.backend = ""
        self.image = ""

    async def __aenter__(self) -> Session:
        info = await self._c.unary(rq.SB_OPEN, self._request)
        self.id, self.backend, self.image = info.session_id, info.backend, info.image
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> bool:
        """Stops the session; False when it was closed already."""
        if not self.id:
            return False
        closed = await self._c.unary(
            rq.SB_CLOSE, sandbox_pb.CloseSessionRequest(session_id=self.id)
        )
        return closed.closed

    async def exec(
        self,
        command: str,
        *,
        timeout: float | None = None,
        workdir: str = "",
        max_output_bytes: int = 0,
    ) -> ExecResult:
        """Runs `bash -lc command` in /workspace (or `workdir` below it)."""
        req = sandbox_pb.ExecRequest(
            session_id=self.id,
            command=command,
            timeout_ms=int(timeout * 1000) if timeout else 0,
            workdir=workdir,
            max_output_bytes=max_output_bytes,
        )
        wait = (timeout or self._c.settings.timeout) + self._c.settings.timeout
        return ExecResult._from(await self._c.unary(rq.SB_EXEC, req, timeout=wait, retry=False))

    async def read(self, path: str, *, max_bytes: int = 0) -> bytes:
        req = sandbox_pb.ReadFileRequest(session_id=self.id, path=path, max_bytes=max_bytes)
        return (await self._c.unary(rq.SB_READ, req)).content

    async def write(self, path: str, content: bytes | str, *, append: bool = False) -> int:
        """Writes a workspace file; returns its size afterwards."""
        req = sandbox_pb.WriteFileRequest(
            session_id=self.id,
            path=path,
            content=content.encode() if isinstance(content, str) else content,
            mode=sandbox_pb.WRITE_MODE_APPEND if append else sandbox_pb.WRITE_MODE_OVERWRITE,
        )
        return (await self._c.unary(rq.SB_WRITE, req, retry=not append)).size_bytes

    async def glob(self, pattern: str, *, base: str = "", max_results: int = 0) -> list[str]:
        req = sandbox_pb.GlobRequest(
            session_id=self.id, pattern=pattern, base_path=base, max_results=max_results
        )
        return list((await self._c.unary(rq.SB_GLOB, req)).paths)

    async def grep(
        self,
        pattern: str,
        *,
        path: str = "",
        regex: bool = False,
        case_sensitive: bool = True,
        max_matches: int = 0,
    ) -> list[GrepMatch]:
        req = sandbox_pb.GrepRequest(
            session_id=self.id,
            pattern=pattern,
            path=path,
            is_regex=regex,
            case_sensitive=case_sensitive,
            max_matches=max_matches,
        )
        return [
            GrepMatch(m.path, m.line, m.text)
            for m in (await self._c.unary(rq.SB_GREP, req)).matches
        ]

    async def pack(
        self,
        to: PathLike | IO[bytes],
        *,
        format: Literal["zip", "tar.gz"] = "zip",
        exclude: Iterable[str] = (),
    ) -> PackSummary:
        """Packs the workspace into an archive written to `to` (a path or a binary file)."""
        req = sandbox_pb.PackRequest(
            session_id=self.id,
            exclude_patterns=list(exclude),
            format=sandbox_pb.ARCHIVE_FORMAT_TAR_GZ
            if format == "tar.gz"
            else sandbox_pb.ARCHIVE_FORMAT_ZIP,
        )
        summary: list[sandbox_pb.PackSummary] = []
        sink = None if hasattr(to, "write") else rq.FileSink(to)
        out = cast(IO[bytes], to) if sink is None else sink.file

        def accept(m: sandbox_pb.PackResponse) -> None:
            if m.HasField("summary"):
                summary.append(m.summary)
            else:
                out.write(m.chunk)

        try:
            async for _ in self._c.follow(
                rq.SB_PACK,
                lambda: req,
                accept,
                resume=False,
                timeout=self._c.settings.transfer_timeout,
            ):
                pass
        except BaseException:
            if sink is not None:
                sink.abort()
            raise
        if sink is not None:
            sink.commit()
        return rq.pack_summary(summary)

    async def touch(self) -> float:
        """Marks the session used; returns seconds until it would close as idle (0 = never)."""
        r = await self._c.unary(rq.SB_TOUCH, sandbox_pb.TouchSessionRequest(session_id=self.id))
        return r.idle_timeout_ms / 1000


class Sandbox:
    """The sandbox-runner: one-shot runs and sessions."""

    def __init__(self, conn: _Conn) -> None:
        self._c = conn

    async def run(
        self,
        code: str = "",
        language: str = "python",
        *,
        inputs: Mapping[str, bytes | str] | None = None,
        outputs: PathLike | None = None,
        code_file: str = "",
        env: Mapping[str, str] | None = None,
        image: str = "",
        network: bool = False,
        timeout: float | None = None,
        memory_bytes: int = 0,
        run: str = "",
        node: str = "",
    ) -> RunResult:
        """Runs `code` with `inputs` staged read-only at /input; what it leaves in /output comes
        back in `result.outputs` (and is written below the local directory `outputs`)."""
        req = rq.sandbox_request(
            code,
            language,
            inputs=inputs,
            code_file=code_file,
            env=env,
            image=image,
            network=network,
            timeout=timeout,
            memory_bytes=memory_bytes,
            run=run,
            node=node,
        )
        wait = (timeout or 600.0) + self._c.settings.timeout
        result = RunResult._from(await self._c.unary(rq.SB_RUN, req, timeout=wait, retry=False))
        if outputs is not None:
            rq.write_outputs(result.outputs, outputs)
        return result

    def session(
        self,
        *,
        image: str = "",
        network: bool = False,
        git_url: str = "",
        git_ref: str = "",
        session_id: str = "",
    ) -> Session:
        """A session to use in an `async with` block (opened on entry, closed on exit)."""
        req = sandbox_pb.OpenSessionRequest(
            session_id=session_id,
            image=image,
            network=network,
            git=sandbox_pb.GitSource(url=git_url, ref=git_ref) if git_url else None,
        )
        return Session(self._c, req)

    async def info(self) -> RunnerInfo:
        return RunnerInfo._from(await self._c.unary(rq.SB_INFO, sandbox_pb.GetRunnerInfoRequest()))


class Ingest:
    """The ingest service: code fences of a document become workspace files."""

    def __init__(self, conn: _Conn) -> None:
        self._c = conn

    async def __call__(
        self,
        document: bytes | str | PathLike,
        *,
        run: str,
        node: str = "manual",
        doc_path: str = "",
        mode: str = "",
        overwrite: bool = False,
        dry_run: bool = False,
        claim: str = "",
        project: str | None = None,
    ) -> Manifest:
        """Ingests `document` (its text or bytes, or a pathlib.Path to read) for `run` and
        returns the manifest; with `dry_run` nothing is written. Over mutual TLS ingest writes
        only under an ingest claim: without `claim` one is taken on `run` (which fences any
        other writer of that run, so give manual ingests runs of their own)."""
        project_id = self._c.project(project)
        if not claim and not dry_run and self._c.settings.tls:
            epoch = (
                await self._c.unary(
                    rq.CLAIM_RUN,
                    store_pb.ClaimRunRequest(
                        project_id=project_id, run_id=run, holder="cairn-client"
                    ),
                )
            ).epoch
            claim = (
                await self._c.unary(
                    rq.GRANT_CLAIM,
                    store_pb.GrantIngestClaimRequest(
                        project_id=project_id, run_id=run, epoch=epoch
                    ),
                )
            ).claim
        req = rq.ingest_request(
            project_id,
            document,
            run=run,
            node=node,
            doc_path=doc_path,
            mode=mode,
            overwrite=overwrite,
            claim=claim,
        )
        return Manifest._from(await self._c.unary(rq.PARSE if dry_run else rq.INGEST, req))

    async def enabled(self, *, run: str = "", project: str | None = None) -> bool:
        req = ingest_pb.GetEnabledRequest(project_id=self._c.project(project), run_id=run)
        return (await self._c.unary(rq.GET_ENABLED, req)).enabled

    async def set_enabled(
        self, enabled: bool, *, run: str = "", project: str | None = None
    ) -> bool:
        req = ingest_pb.SetEnabledRequest(
            project_id=self._c.project(project), run_id=run, enabled=enabled
        )
        return (await self._c.unary(rq.SET_ENABLED, req)).enabled


class AsyncClient:
    """An asyncio cairn client. `AsyncClient.from_env()` reads the CLI's settings; arguments given
    here or there override them. Use it in an `async with` block, or await close()."""

    def __init__(
        self,
        addr: str | None = None,
        *,
        settings: Settings | None = None,
        **options: Unpack[Options],
    ) -> None:
        base = settings or Settings()
        self.settings = base.merged(addr=addr, **options)
        self._conn = _Conn(self.settings)
        self.runs = Runs(self._conn)
        self.store = Store(self._conn)
        self.sandbox = Sandbox(self._conn)
        self.ingest = Ingest(self._conn)

    @classmethod
    def from_env(cls, addr: str | None = None, **options: Unpack[Options]) -> AsyncClient:
        """Settings from CAIRN_ADDR, CAIRN_STORE_ADDR, CAIRN_INGEST_ADDR, CAIRN_SANDBOX_ADDR,
        CAIRN_TLS_DIR (or CAIRN_TLS_CERT/KEY/CA), CAIRN_TLS_SERVER_NAME, CAIRN_TOKEN (or
        CAIRN_TOKEN_FILE) and CAIRN_PROJECT; keyword arguments override them."""
        return cls(addr, settings=Settings.from_env(), **options)

    async def close(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
