"""Serving: the code the serving image (Dockerfile.serving) runs. `predict` loads an export the way TF Serving
loads it and reads rows as training read them; `serve` answers Vertex AI's custom-container contract over HTTP.
Imports the trainer's data layer (the schema) and nothing of scripts/."""
