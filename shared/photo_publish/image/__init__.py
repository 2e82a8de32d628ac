"""Image: decode once, render the variants (libvips), placeholders, the recipe; no I/O."""
