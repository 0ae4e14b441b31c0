"""The release: building and reading the bundle a device team receives, and its model card."""
