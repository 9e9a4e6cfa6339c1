"""Dataset scripts: CS231n COCO download, COCO grid-feature builder, offline shapes dataset."""
