"""Ray orchestration: NodeHost actors, each hosting many synthetic nodes."""
