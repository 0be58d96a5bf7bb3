"""Generated protobuf/gRPC code (by scripts/gen_proto.sh). Do not edit."""
