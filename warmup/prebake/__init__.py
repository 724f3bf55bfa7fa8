"""Prebake: run SGLang once against empty caches and pack what it compiled, for an image or a
registry (:mod:`warmup.prebake.bake`); stopping the server's process group
(:mod:`warmup.prebake.process_group`)."""
