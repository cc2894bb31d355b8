"""flexmig.mqtt: the MQTT side. Events and their outbox, the retained status and state, the publisher, the
command listener and its schema, and the subscriber ``flexmig events`` runs."""
