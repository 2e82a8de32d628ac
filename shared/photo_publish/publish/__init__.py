"""Publishing a photo: the service that claims, renders and stores, the delivery that answers the queue, and the one transaction."""
