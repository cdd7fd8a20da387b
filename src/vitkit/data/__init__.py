"""Datasets (built-in, in-memory, ImageFolder and webdataset shards), transforms and
reproducible, rank-aware loaders."""

from vitkit.data.arrays import ArrayDataset, DataInfo
from vitkit.data.datasets import BUILTIN_DATASETS, load_dataset
from vitkit.data.digits import load_digits
from vitkit.data.folder import IMAGE_EXTENSIONS, ImageFolderDataset, collate_skipping
from vitkit.data.loader import (
    ArrayLoader,
    EpochBatchSampler,
    EpochDataLoader,
    EpochLoader,
    make_loader,
)
from vitkit.data.mnist import load_mnist
from vitkit.data.shapes import SHAPE_CLASSES, make_shapes
from vitkit.data.shards_index import is_shard_dir
from vitkit.data.shards_read import ShardDataset, ShardLoader
from vitkit.data.shards_write import write_shards
from vitkit.data.transforms import (
    IMAGE_MEAN,
    IMAGE_STD,
    PilEvalTransform,
    PilTrainTransform,
    match_channels,
    normalize,
    pil_to_tensor,
    random_resized_crop_batch,
    random_translate_scale_batch,
    resize_batch,
    to_model_input,
)

__all__ = [
    "BUILTIN_DATASETS",
    "IMAGE_EXTENSIONS",
    "IMAGE_MEAN",
    "IMAGE_STD",
    "SHAPE_CLASSES",
    "ArrayDataset",
    "ArrayLoader",
    "DataInfo",
    "EpochBatchSampler",
    "EpochDataLoader",
    "EpochLoader",
    "ImageFolderDataset",
    "PilEvalTransform",
    "PilTrainTransform",
    "ShardDataset",
    "ShardLoader",
    "collate_skipping",
    "is_shard_dir",
    "load_dataset",
    "load_digits",
    "load_mnist",
    "make_loader",
    "make_shapes",
    "match_channels",
    "normalize",
    "pil_to_tensor",
    "random_resized_crop_batch",
    "random_translate_scale_batch",
    "resize_batch",
    "to_model_input",
    "write_shards",
]
