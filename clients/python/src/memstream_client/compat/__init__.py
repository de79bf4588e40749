"""Drop-in surfaces of other memory libraries on memstream (`compat.mem0`)."""
