"""The model registry's service verbs: the catalog of models, configs and files (`catalog`),
pulls from the Hugging Face Hub (`downloads`) and the variants a repository offers
(`variants`)."""
