"""Generated protobuf modules; regenerate with scripts/gen_tubemq_proto.sh, never edit."""
