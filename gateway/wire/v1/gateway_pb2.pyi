from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CapabilityDescriptor(_message.Message):
    __slots__ = ("name", "version", "risk", "timeout_seconds", "idempotent", "description", "input_schema_json", "output_schema_json", "preconditions", "examples_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RISK_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    PRECONDITIONS_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    risk: str
    timeout_seconds: float
    idempotent: bool
    description: str
    input_schema_json: str
    output_schema_json: str
    preconditions: _containers.RepeatedScalarFieldContainer[str]
    examples_json: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., risk: _Optional[str] = ..., timeout_seconds: _Optional[float] = ..., idempotent: _Optional[bool] = ..., description: _Optional[str] = ..., input_schema_json: _Optional[str] = ..., output_schema_json: _Optional[str] = ..., preconditions: _Optional[_Iterable[str]] = ..., examples_json: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("agent_id", "protocol_version", "capabilities", "max_payload_bytes", "grant_expires_at")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    MAX_PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    GRANT_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    protocol_version: str
    capabilities: _containers.RepeatedCompositeFieldContainer[CapabilityDescriptor]
    max_payload_bytes: int
    grant_expires_at: str
    def __init__(self, agent_id: _Optional[str] = ..., protocol_version: _Optional[str] = ..., capabilities: _Optional[_Iterable[_Union[CapabilityDescriptor, _Mapping]]] = ..., max_payload_bytes: _Optional[int] = ..., grant_expires_at: _Optional[str] = ...) -> None: ...

class InvokeRequest(_message.Message):
    __slots__ = ("request_id", "capability", "version_constraint", "payload", "deadline_unix_ms", "task_id", "step_id", "idempotency_key")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    VERSION_CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    capability: str
    version_constraint: str
    payload: bytes
    deadline_unix_ms: int
    task_id: str
    step_id: str
    idempotency_key: str
    def __init__(self, request_id: _Optional[str] = ..., capability: _Optional[str] = ..., version_constraint: _Optional[str] = ..., payload: _Optional[bytes] = ..., deadline_unix_ms: _Optional[int] = ..., task_id: _Optional[str] = ..., step_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class InvokeResponse(_message.Message):
    __slots__ = ("request_id", "capability", "served_version", "payload", "evidence_sha256", "replayed")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    SERVED_VERSION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_SHA256_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    capability: str
    served_version: str
    payload: bytes
    evidence_sha256: str
    replayed: bool
    def __init__(self, request_id: _Optional[str] = ..., capability: _Optional[str] = ..., served_version: _Optional[str] = ..., payload: _Optional[bytes] = ..., evidence_sha256: _Optional[str] = ..., replayed: _Optional[bool] = ...) -> None: ...
