"""Deployment generators (``ranksight k8s``) and the files they write under ``deploy/``."""
