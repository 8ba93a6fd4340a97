"""Authentication: API keys (HMAC digest lookup), password sign-in and browser sessions."""

from __future__ import annotations

import asyncio
import functools
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from bullpen.domain import tokens
from bullpen.domain.access import AGENT_PERMISSIONS, ROLE_PERMISSIONS, effective, parse_scopes
from bullpen.domain.principal import NO_WORKSPACE, Principal, Role
from bullpen.errors import RateLimited, Unauthenticated, Unavailable
from bullpen.security.passwords import HashCost, PasswordPool
from bullpen.security.ratelimit import FailureWindow
from bullpen.store import audit, identity
from bullpen.store.base import Store

_KEY_CACHE_MAX = 10_000
_TOUCH_EVERY = timedelta(seconds=60)  # last_used_at precision; keeps writes off the hot path
_TOUCHED_MAX = 10_000  # keys remembered as touched by this process, at the most
_LOGIN_NONCE_MAX = 128

# The default cost (argon2id, OWASP's floor); a server hashes at its configured cost.
PASSWORDS = HashCost().hasher()


@dataclass(frozen=True, slots=True)
class SessionPrincipal:
    """A signed-in browser user."""

    principal: Principal
    email: str


def hash_password(password: str) -> str:
    """An argon2id hash of a password at the default cost (blocking: call in a thread)."""
    return PASSWORDS.hash(password)


class AuthService:
    """Turns credentials into a Principal, or refuses with Unauthenticated."""

    def __init__(
        self,
        store: Store,
        secret: bytes,
        clock: Callable[[], datetime],
        *,
        login_failures: FailureWindow,
        login_failures_per_client: FailureWindow,
        session_ttl: timedelta,
        passwords: PasswordPool,
        key_cache_s: float = 0.0,
    ) -> None:
        self._store = store
        self._secret = secret
        self._clock = clock
        self.passwords = passwords
        # At the configured cost, like every current stored hash: both paths cost the same.
        self._dummy_hash = passwords.hash_now("not-a-real-password")
        self._by_email = login_failures
        self._by_client = login_failures_per_client
        self.session_ttl = session_ttl
        # API keys by digest, with the monotonic time each entry expires at. Any write of the
        # rows a key's principal comes from, in this process, empties it (`store.watch`);
        # other processes' changes apply within `key_cache_s`.
        self._key_cache_s = key_cache_s
        self._keys: dict[bytes, tuple[float, identity.KeyRecord]] = {}
        self._reading: dict[bytes, asyncio.Future[identity.KeyRecord | None]] = {}
        self._keys_generation = 0
        # When this process wrote (or began to write) each key's `last_used_at`: a burst of
        # requests on a key writes it once, not once per request in flight (each such write
        # takes a connection and waits on the key's row for the others).
        self._touched: dict[UUID, datetime] = {}
        if key_cache_s > 0:
            store.watch(identity.KEY_SOURCES, self._forget_keys)

    def _forget_keys(self) -> None:
        self._keys.clear()
        self._reading.clear()  # a read begun before the write may return the old row
        self._keys_generation += 1

    async def authenticate_key(self, token: str) -> Principal:
        """The principal an API key acts as."""
        if not tokens.looks_like_api_key(token):
            raise Unauthenticated("invalid API key")
        digest = tokens.digest(self._secret, token)
        record = await self._key(digest)
        now = self._clock()
        if (
            record is None
            or record.revoked_at is not None
            or (record.expires_at is not None and record.expires_at <= now)
        ):
            raise Unauthenticated("invalid API key")
        if (
            record.last_used_at is None or now - record.last_used_at > _TOUCH_EVERY
        ) and self._touch_due(record.id, now):
            try:
                async with self._store.autocommit() as conn:
                    await identity.touch_api_key(conn, record.id, now)
            except BaseException:
                self._touched.pop(record.id, None)  # the next request tries again
                raise
        granted = (
            AGENT_PERMISSIONS if record.agent_id is not None else ROLE_PERMISSIONS[record.role]
        )
        scopes = parse_scopes(record.scopes)
        return Principal(
            workspace_id=record.workspace_id,
            user_id=record.user_id,
            api_key_id=record.id,
            role=record.role,
            via="api_key",
            permissions=effective(granted, scopes),
            agent_id=record.agent_id,
            # Only an unscoped key (`*`) carries its user's instance-admin powers.
            is_instance_admin=record.is_instance_admin and scopes is None,
            rpm_limit=record.rpm_limit,
            tpm_limit=record.tpm_limit,
        )

    def _touch_due(self, key_id: UUID, now: datetime) -> bool:
        """Whether this request writes the key's `last_used_at`: not when this process wrote
        it, or began to, within `_TOUCH_EVERY`."""
        last = self._touched.get(key_id)
        if last is not None and now - last <= _TOUCH_EVERY:
            return False
        if len(self._touched) >= _TOUCHED_MAX:
            recent = {k: t for k, t in self._touched.items() if now - t <= _TOUCH_EVERY}
            self._touched = recent if len(recent) < _TOUCHED_MAX else {}
        self._touched[key_id] = now
        return True

    async def _key(self, digest: bytes) -> identity.KeyRecord | None:
        """The key's record: cached for `key_cache_s`, unknown keys never. Requests that miss
        while the key is being read wait for that one read (when an entry expires, every
        request with the key in flight would otherwise read it again)."""
        cached = self._keys.get(digest)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        if self._key_cache_s <= 0:
            return await self._read_key(digest)
        reading = self._reading.get(digest)
        if reading is None:
            reading = asyncio.ensure_future(self._read_key(digest))
            self._reading[digest] = reading
            reading.add_done_callback(functools.partial(self._read_done, digest))
        # Shielded: a request that goes away must not cancel the read others wait on.
        return await asyncio.shield(reading)

    def _read_done(self, digest: bytes, done: asyncio.Future[identity.KeyRecord | None]) -> None:
        if self._reading.get(digest) is done:
            del self._reading[digest]
        if not done.cancelled():
            done.exception()  # retrieved: every waiter may have gone

    async def _read_key(self, digest: bytes) -> identity.KeyRecord | None:
        generation = self._keys_generation
        async with self._store.read() as conn:
            record = await identity.find_api_key(conn, digest)
        # Not kept if a write of its rows happened meanwhile: the row read may be the old one.
        if record is not None and self._key_cache_s > 0 and generation == self._keys_generation:
            if len(self._keys) >= _KEY_CACHE_MAX:
                self._keys.clear()
            self._keys[digest] = (time.monotonic() + self._key_cache_s, record)
        return record

    async def authenticate_session(self, session_id: str) -> SessionPrincipal:
        """The signed-in user behind a session cookie."""
        if not session_id or len(session_id) > 128:
            raise Unauthenticated("not signed in")
        async with self._store.read() as conn:
            record = await identity.find_session(conn, tokens.digest(self._secret, session_id))
        if record is None or record.expires_at <= self._clock():
            raise Unauthenticated("not signed in")
        # A user in no workspace yet may only read its invitations and accept one.
        role = record.role if record.role is not None else Role.VIEWER
        principal = Principal(
            workspace_id=record.workspace_id or NO_WORKSPACE,
            user_id=record.user_id,
            api_key_id=None,
            role=role,
            via="session",
            permissions=ROLE_PERMISSIONS[role] if record.role is not None else frozenset(),
            is_instance_admin=record.is_instance_admin,
        )
        return SessionPrincipal(principal, record.email)

    async def switch_workspace(
        self, session_id: str, principal: Principal, workspace_id: UUID
    ) -> None:
        """Make the session act in another workspace of its user (issue 19, finding 10).

        The caller checked the membership; every later request checks it again. A move is
        audited in the workspace entered, with the one left (staying put records nothing).
        """
        if workspace_id == principal.workspace_id:
            return
        left = principal.workspace_id
        async with self._store.write() as conn:
            moved = await identity.set_session_workspace(
                conn, tokens.digest(self._secret, session_id), workspace_id
            )
            if moved:
                await audit.record(
                    conn,
                    workspace_id=workspace_id,
                    actor_type=principal.actor_type,
                    actor_id=principal.actor_id,
                    action="session.switch_workspace",
                    target_type="workspace",
                    target_id=workspace_id,
                    now=self._clock(),
                    data={"from_workspace_id": None if left == NO_WORKSPACE else str(left)},
                )

    async def sign_in(self, email: str, password: str, *, client: str) -> str:
        """Check a password and open a new session; returns the session id for the cookie.

        Failures are counted per email (known or not, so the answer never tells which) and
        per client address; past the threshold the answer is RateLimited with a wait. An
        attempt counts from the moment it arrives, so concurrent ones cannot outrun the count;
        a successful one is refunded. A full password pool is Unavailable (nothing counted).
        """
        email = email.strip().lower()[:320]
        self._by_email.take(email)
        try:
            self._by_client.take(client)
        except RateLimited:
            self._by_email.release(email)
            raise
        try:
            return await self._sign_in(email, password[:1024], client)
        finally:
            self._by_email.release(email)
            self._by_client.release(client)

    async def _sign_in(self, email: str, password: str, client: str) -> str:
        self.passwords.admit()  # a full pool turns the attempt away before the store is read
        async with self._store.read() as conn:
            user = await identity.find_user_for_login(conn, email)
            membership = await identity.first_membership(conn, user.id) if user else None
        stored = user.password_hash if user is not None else self._dummy_hash
        # Verify even for unknown users so both cases cost the same.
        ok = await self.passwords.verify(stored, password)
        # A user in no workspace signs in too (finding 10): it can then accept an invitation.
        if user is None or not ok:
            self._by_email.fail(email)
            self._by_client.fail(client)
            raise Unauthenticated("wrong email or password")
        self._by_email.reset(email)
        rehashed = await self._rehash(stored, password)
        session_id = tokens.new_session_id()
        now = self._clock()
        async with self._store.write() as conn:
            await identity.create_session(
                conn,
                digest=tokens.digest(self._secret, session_id),
                user_id=user.id,
                workspace_id=membership[0] if membership is not None else None,
                now=now,
                expires_at=now + self.session_ttl,
            )
            if rehashed is not None:
                await identity.replace_password_hash(conn, user.id, stored, rehashed)
        return session_id

    async def _rehash(self, stored: str, password: str) -> str | None:
        """A hash at the configured cost when `stored` was made at another, else None.

        Only now, with the password proven, can it be hashed anew; a busy pool leaves it for
        the next sign-in.
        """
        if not self.passwords.needs_rehash(stored):
            return None
        try:
            return await self.passwords.hash(password)
        except Unavailable:
            return None

    async def hash_password(self, password: str) -> str:
        """A new hash of `password` at the configured cost, on the password pool."""
        return await self.passwords.hash(password)

    async def verify_password(self, user_id: UUID, password: str) -> bool:
        """Whether `password` is the user's current one (for a password change).

        Wrong guesses count against the same failure window as sign-ins (RateLimited after it).
        """
        attempt = f"user:{user_id}"
        self._by_email.take(attempt)
        try:
            async with self._store.read() as conn:
                stored = await identity.password_hash(conn, user_id)
            ok = stored is not None and await self.passwords.verify(stored, password[:1024])
            if ok:
                self._by_email.reset(attempt)
            else:
                self._by_email.fail(attempt)
            return ok
        finally:
            self._by_email.release(attempt)

    async def sign_out(self, session_id: str) -> None:
        """End a session (unknown ids are ignored)."""
        async with self._store.write() as conn:
            await identity.delete_session(conn, tokens.digest(self._secret, session_id))

    def csrf_token(self, session_id: str) -> str:
        """The CSRF token bound to a session."""
        return tokens.digest(self._secret, "csrf:" + session_id).hex()

    def check_csrf(self, session_id: str, token: str) -> bool:
        """Whether a submitted CSRF token belongs to this session (constant time).

        Compared as bytes: `compare_digest` refuses str with non-ASCII characters (a TypeError,
        so a 500), and a header or form field may carry anything.
        """
        sent = token.encode("utf-8", "surrogatepass")
        return hmac.compare_digest(self.csrf_token(session_id).encode("ascii"), sent)

    def login_token(self, nonce: str) -> str:
        """The sign-in form's CSRF token for a browser's pre-session nonce (its cookie)."""
        return tokens.digest(self._secret, "login-csrf:" + nonce).hex()

    def check_login_token(self, nonce: str, token: str) -> bool:
        """Whether a sign-in form's token belongs to the nonce its browser sent (constant
        time); any other token, or none, is False."""
        if not nonce or len(nonce) > _LOGIN_NONCE_MAX or not token:
            return False
        expected = self.login_token(nonce).encode()
        return hmac.compare_digest(expected, token.encode("utf-8", "replace"))
