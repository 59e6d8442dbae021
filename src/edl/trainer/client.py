"""The trainer's HTTP client for the master (httpx, retried with tenacity)."""

from __future__ import annotations

import os
from typing import Any

import httpx
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_exponential

from edl.errors import PermanentError, TemporaryError, UserError


class MasterUnavailable(TemporaryError):
    pass


class MasterClient:
    def __init__(self, address: str, token: str, timeout_s: float = 15.0, give_up_s: float | None = None) -> None:
        self.base = address if address.startswith("http") else f"http://{address}"
        self._http = httpx.Client(
            base_url=self.base,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout_s, connect=2.0),
        )
        self.give_up_s = give_up_s if give_up_s is not None else float(os.environ.get("EDL_MASTER_GIVE_UP_S", "300"))

    def close(self) -> None:
        self._http.close()

    def _once(self, method: str, path: str, **kw: Any) -> dict:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise MasterUnavailable(f"master at {self.base} unreachable: {type(e).__name__}") from e
        if r.status_code == 401:
            raise UserError(f"master at {self.base} refused the job token (401)")
        if r.status_code == 400:
            raise UserError(r.json().get("detail", r.text))
        if r.status_code == 409:
            return {"status": "stale"}
        if r.status_code >= 500:
            raise MasterUnavailable(f"master error {r.status_code} on {path}")
        if r.status_code >= 400:
            raise PermanentError(f"master answered {r.status_code} on {path}: {r.text[:200]}")
        return r.json()

    def call(self, method: str, path: str, **kw: Any) -> dict:
        """Call, retrying while the master is unreachable (it may be restarting)."""
        return retry(
            retry=retry_if_exception_type(MasterUnavailable),
            wait=wait_exponential(multiplier=0.05, max=1.0),
            stop=stop_after_delay(self.give_up_s),
            reraise=True,
        )(self._once)(method, path, **kw)

    def try_call(self, method: str, path: str, **kw: Any) -> dict | None:
        """One attempt; ``None`` when the master is unreachable."""
        try:
            return self._once(method, path, **kw)
        except MasterUnavailable:
            return None
