"""The ``a2a-gateway`` command line."""

from gateway.telemetry.grpc_core_logs import quiet_grpc_core

# Before any submodule imports grpc: gRPC core reads its verbosity once.
quiet_grpc_core()
