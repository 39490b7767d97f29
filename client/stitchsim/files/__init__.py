"""Strict checks of safetensors files from strangers, standard library only: run in the client
before an upload, in the gateway on upload and in the engine before loading.

    limits   sizes, counts and dtypes accepted
    errors   what a refused file raises (each carries its registry code)
    sniff    other formats (pickle, zip, numpy ...) told apart from the first bytes
    header   the header: length, JSON, metadata, tensor entries, offsets tiling the file
    dataset  the dataset schema: the one validator of an image-classification file
    model_config  a model folder's config.json / preprocessor_config.json: JSON, capped, no
             remote code, and what it says (architecture, kwargs, preprocessing)
    digest   a file's SHA-256 (an object's id)
    folder   a save_pretrained / timm hub folder packed into one file carrying its config
"""
