"""/api/v1/api-keys: create (the key is shown once), list, read and revoke API keys."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Response

from bullpen.api import docs
from bullpen.api.deps import ApiKeys as Keys
from bullpen.api.deps import require, require_json
from bullpen.api.idempotency import Idempotent
from bullpen.api.schemas.keys import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyList,
    ApiKeyPublic,
    ApiKeyUpdate,
)
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal

router = APIRouter(prefix="/api/v1/api-keys", tags=["api-keys"])

KeyId = Annotated[UUID, docs.path_id("API key")]
Reader = Annotated[Principal, require(Permission.KEYS_READ)]
Writer = Annotated[Principal, require(Permission.KEYS_WRITE)]

_KEY_LINKS = {
    "GetApiKey": docs.link("getApiKey", key_id="$response.body#/id"),
    "UpdateApiKey": docs.link("updateApiKey", key_id="$response.body#/id"),
    "RevokeApiKey": docs.link("revokeApiKey", key_id="$response.body#/id"),
}


@router.get(
    "",
    operation_id="listApiKeys",
    response_model=ApiKeyList,
    responses=docs.problems(401, 403, 429, 503),
    summary="List API keys",
)
async def list_api_keys(principal: Reader, keys: Keys) -> ApiKeyList:
    """The caller's own keys, newest first, revoked and expired ones included.

    With `keys:admin`: every key of the workspace, users' and agents'. At most the 200 newest.
    """
    rows = await keys.list(principal)
    return ApiKeyList(items=[ApiKeyPublic.from_row(row) for row in rows])


@router.post(
    "",
    operation_id="createApiKey",
    status_code=201,
    response_model=ApiKeyCreated,
    dependencies=[Depends(require_json)],
    responses={
        **docs.created(ApiKeyCreated, "The key; `key` is shown only here", _KEY_LINKS),
        **docs.problems(*docs.WRITE),
    },
    summary="Create an API key",
)
async def create_api_key(
    body: ApiKeyCreate, principal: Writer, keys: Keys, idem: Idempotent
) -> Response:
    """A new key, returned once in `key`; only its HMAC digest is stored.

    The scopes must be within the caller's own permissions (403 otherwise). A key for an
    agent (`agent_id`) needs `keys:admin`. A replay returns `key: null`.
    """
    async with idem.begin(principal) as tx:
        row, key = await keys.create(
            principal,
            name=body.name,
            scopes=[str(scope) for scope in body.scopes],
            expires_at=body.expires_at,
            agent_id=body.agent_id,
            workspace_id=body.workspace_id,
            rpm_limit=body.rpm_limit,
            tpm_limit=body.tpm_limit,
        )
        public = ApiKeyPublic.from_row(row).model_dump()
        return tx.respond(
            201,
            ApiKeyCreated(**public, key=key),
            stored=ApiKeyCreated(**public, key=None),
            location=f"/api/v1/api-keys/{row.id}",
        )


@router.get(
    "/{key_id}",
    operation_id="getApiKey",
    response_model=ApiKeyPublic,
    responses=docs.problems(*docs.READ),
    summary="Get an API key",
)
async def get_api_key(key_id: KeyId, principal: Reader, keys: Keys) -> ApiKeyPublic:
    """One of the caller's keys, or any key of the workspace with `keys:admin`."""
    return ApiKeyPublic.from_row(await keys.get(principal, key_id))


@router.patch(
    "/{key_id}",
    operation_id="updateApiKey",
    response_model=ApiKeyPublic,
    dependencies=[Depends(require_json)],
    responses=docs.problems(400, 401, 403, 404, 413, 415, 422, 429, 503),
    summary="Change an API key's relay limits",
)
async def update_api_key(
    key_id: KeyId, body: ApiKeyUpdate, principal: Writer, keys: Keys
) -> ApiKeyPublic:
    """Set or remove (`null`) the key's requests and tokens per minute on the relay; they
    apply to its next call. Own keys need `keys:write`, others' `keys:admin`."""
    changes = body.model_dump(exclude_unset=True)
    return ApiKeyPublic.from_row(await keys.set_limits(principal, key_id, changes))


@router.delete(
    "/{key_id}",
    operation_id="revokeApiKey",
    status_code=204,
    response_class=Response,
    responses=docs.problems(401, 403, 404, 422, 429, 503),
    summary="Revoke an API key",
)
async def revoke_api_key(key_id: KeyId, principal: Writer, keys: Keys) -> Response:
    """The key stops working at once; revoking a revoked key is a no-op.

    Own keys need `keys:write`, others' (users' and agents') `keys:admin`.
    """
    await keys.revoke(principal, key_id)
    return Response(status_code=204)
