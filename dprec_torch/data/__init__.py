"""The data layer: ratings containers, readers, MovieLens/custom/synthetic loaders, splits, preprocessing."""

from dprec_torch.data.custom import load_custom
from dprec_torch.data.movielens import cache_dir, download_movielens, load_movielens, locate_movielens
from dprec_torch.data.preprocess import build_dataset, cap_user_ratings, filter_min_user_ratings, preprocess_fold
from dprec_torch.data.ratings import Fold, RatingDataset, Ratings, RatingScale
from dprec_torch.data.readers import RawRatings, build_id_space, encode, read_ratings
from dprec_torch.data.splits import holdout_folds, holdout_indices, select_folds
from dprec_torch.data.synthetic import PRESETS, generate_synthetic, load_synthetic

__all__ = [
    "PRESETS", "Fold", "RatingDataset", "RatingScale", "Ratings", "RawRatings", "build_dataset", "build_id_space",
    "cache_dir", "cap_user_ratings", "download_movielens", "encode", "filter_min_user_ratings", "generate_synthetic",
    "holdout_folds", "holdout_indices", "load_custom", "load_movielens", "load_synthetic", "locate_movielens",
    "preprocess_fold", "read_ratings", "select_folds",
]
