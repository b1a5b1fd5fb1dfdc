"""extracted_images: every image of a document, its bytes moved into the content-addressed store."""

import dagster as dg

from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.defs.previews import first_words, image_grid, where
from vision_rag_pipeline.defs.resources import IndexDatabase
from vision_rag_pipeline.documents.model import LoadedDocument
from vision_rag_pipeline.images.model import ExtractedImage


@dg.asset(
    partitions_def=documents_partitions,
    group_name="images",
    kinds={"python", "postgres"},
    description="Every image part / embedded raster with alt text, caption, context and position; "
    "bytes stored once per sha256 in the image store.",
)
def extracted_images(
    context: dg.AssetExecutionContext, raw_documents: dict[str, LoadedDocument], index_db: IndexDatabase
) -> dg.Output[dict[str, list[ExtractedImage]]]:
    store = index_db.image_store()
    values: dict[str, list[ExtractedImage]] = {}
    for key, doc in raw_documents.items():
        stored = store.put_many(doc.images)
        images = [ExtractedImage.of(image) for image in doc.images]
        mimes: dict[str, int] = {}
        for image in images:
            mimes[image.mime] = mimes.get(image.mime, 0) + 1
        context.log.info(f"{key}: {len(images)} images, {stored} new in the store")
        context.add_asset_metadata(
            {
                "thumbnails": image_grid(
                    doc.images,
                    {
                        "where": where,
                        "size": lambda image: f"{image.width}×{image.height}" if image.width else "",
                        "alt or caption": lambda image: first_words(
                            image.alt or image.caption or image.title
                        ),
                    },
                ),
                "images": len(images),
                "unique_images": len({i.sha256 for i in images}),
                "newly_stored": stored,
                "by_mime": dg.MetadataValue.json(mimes),
                "page_images": sum(i.is_page_image for i in images),
                "text_layer_images": sum(bool(i.text_layer) for i in images),  # read from the PDF, not OCR'd
            },
            partition_key=key,
        )
        values[key] = images
    return dg.Output(values)
