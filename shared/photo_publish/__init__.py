"""photo-publish: turn an uploaded original into published, web-ready variants."""
